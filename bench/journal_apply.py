"""Journal apply() throughput of guaranteed jobs: the SQLite journal against the
PostgreSQL one (``PgJournal``, on a cluster made here with ``initdb``: fsync on,
synchronous_commit on, as a user who wants "nothing lost" runs it).

Each guaranteed job is two operations, as the broker writes them: its put when it
arrives and its done when it ends. A loop turn writes ``batch`` new jobs and ends
the previous turn's in one ``apply``; the figure is jobs per second, and the
commit's latency (p50/p99) per batch size. Fenced (a lease held, each commit
renews it) for PostgreSQL, as an active broker writes.

    python bench/journal_apply.py [--seconds 5] [--batches 1,100,1000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from emq_django.broker.journal import Journal  # noqa: E402
from emq_django.broker.journal_pg import PgJournal  # noqa: E402
from emq_django.broker.lease import Lease  # noqa: E402
from tests.support.postgres import PgCluster  # noqa: E402

BODY = b"x" * 200
HEADERS = b"h" * 60


def run(journal: Any, batch: int, seconds: float) -> tuple[float, float, float]:
    """(jobs/s, p50 ms, p99 ms) over ``seconds`` of turns of ``batch`` jobs."""
    n = 0
    previous: list[bytes] = []
    took: list[float] = []
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        wall = time.time()
        ids = [b"%08d-%s" % (n + i, os.urandom(4).hex().encode()) for i in range(batch)]
        ops: list[Any] = [
            ("put", i, "default", HEADERS, BODY, "ready", 0, 0.0, wall, wall) for i in ids
        ]
        ops += [("done", i, wall) for i in previous]
        t = time.perf_counter()
        journal.apply(ops)
        took.append(time.perf_counter() - t)
        previous = ids
        n += batch
    elapsed = time.perf_counter() - started
    took.sort()
    p99 = took[min(len(took) - 1, int(len(took) * 0.99))]
    return n / elapsed, statistics.median(took) * 1000, p99 * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--batches", default="1,100,1000")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    with tempfile.TemporaryDirectory(prefix="emq-journal-bench-") as tmp:
        cluster = PgCluster(Path(tmp) / "pg")
        cluster.start()
        try:
            rows = []
            for batch in batches:
                for sync in ("normal", "full"):
                    path = Path(tmp) / f"j-{sync}-{batch}.sqlite3"
                    journal = Journal(path, sync)
                    rows.append((f"sqlite sync={sync}", batch, *run(journal, batch, args.seconds)))
                    journal.close()
                url = cluster.create_database(f"bench_{batch}")
                lease = Lease(url, "bench", 5.0)
                pg = PgJournal(url, name="bench")
                pg.fence(lease.try_acquire(), 5.0)
                rows.append(("postgresql fenced", batch, *run(pg, batch, args.seconds)))
                pg.close()
                lease.close()
            print(f"{'journal':<22}{'batch':>6}{'jobs/s':>10}{'p50 ms':>9}{'p99 ms':>9}")
            for name, batch, rate, p50, p99 in rows:
                print(f"{name:<22}{batch:>6}{rate:>10.0f}{p50:>9.2f}{p99:>9.2f}")
        finally:
            cluster.destroy()


if __name__ == "__main__":
    main()
