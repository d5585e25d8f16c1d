"""Journal apply() throughput of guaranteed jobs: the SQLite journal against the
PostgreSQL one (``PgJournal``, on a cluster made here with ``initdb``: fsync on,
synchronous_commit on, as a user who wants "nothing lost" runs it).

Each guaranteed job is two operations, as the broker writes them: its put when it
arrives and its done when it ends. A loop turn writes ``batch`` new jobs and ends
the previous turn's in one ``apply``; the figure is jobs per second, and the
commit's latency (p50/p99) per batch size. Fenced (a lease held, each commit
renews it) for PostgreSQL, as an active broker writes.

With ``--replies`` each journal runs twice: the plain done, and the done row that
keeps the job's reply (``KeepReply``: a guaranteed job whose client wants a
reply, broker/kept_replies.py), for the cost of keeping replies.

    python bench/journal_apply.py [--seconds 5] [--batches 1,100,1000] [--replies]
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
from emq_django.broker.kept_replies import encode_reply  # noqa: E402
from emq_django.broker.lease import Lease  # noqa: E402
from tests.support.postgres import PgCluster  # noqa: E402

BODY = b"x" * 200
HEADERS = b"h" * 60
REPLY = encode_reply(False, b"ok", b'{"value": 12345}')


def run(
    journal: Any, batch: int, seconds: float, reply: bool = False
) -> tuple[float, float, float, float]:
    """(jobs/s, p50 ms, p99 ms, this process's CPU µs per job: what the broker's
    loop spends) over ``seconds`` of turns of ``batch`` jobs."""
    n = 0
    previous: list[bytes] = []
    took: list[float] = []
    started = time.perf_counter()
    cpu = time.process_time()
    while time.perf_counter() - started < seconds:
        wall = time.time()
        ids = [b"%08d-%s" % (n + i, os.urandom(4).hex().encode()) for i in range(batch)]
        ops: list[Any] = [
            ("put", i, "default", HEADERS, BODY, "ready", 0, 0.0, wall, wall) for i in ids
        ]
        if reply:
            ops += [("reply", i, REPLY, wall) for i in previous]
        else:
            ops += [("done", i, wall) for i in previous]
        t = time.perf_counter()
        journal.apply(ops)
        took.append(time.perf_counter() - t)
        previous = ids
        n += batch
    elapsed = time.perf_counter() - started
    cpu_us = (time.process_time() - cpu) / max(n, 1) * 1e6
    took.sort()
    p99 = took[min(len(took) - 1, int(len(took) * 0.99))]
    return n / elapsed, statistics.median(took) * 1000, p99 * 1000, cpu_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--batches", default="1,100,1000")
    parser.add_argument("--replies", action="store_true", help="also with replies kept")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    modes = (False, True) if args.replies else (False,)
    with tempfile.TemporaryDirectory(prefix="emq-journal-bench-") as tmp:
        cluster = PgCluster(Path(tmp) / "pg")
        cluster.start()
        try:
            rows = []
            for batch, reply in [(b, r) for b in batches for r in modes]:
                tag = " +reply" if reply else ""
                for sync in ("normal", "full"):
                    path = Path(tmp) / f"j-{sync}-{batch}-{reply}.sqlite3"
                    journal = Journal(path, sync)
                    figures = run(journal, batch, args.seconds, reply)
                    rows.append((f"sqlite sync={sync}{tag}", batch, *figures))
                    journal.close()
                url = cluster.create_database(f"bench_{batch}_{int(reply)}")
                lease = Lease(url, "bench", 5.0)
                pg = PgJournal(url, name="bench")
                pg.fence(lease.try_acquire(), 5.0)
                figures = run(pg, batch, args.seconds, reply)
                rows.append((f"postgresql fenced{tag}", batch, *figures))
                pg.close()
                lease.close()
            head = f"{'journal':<30}{'batch':>6}{'jobs/s':>10}{'p50 ms':>9}{'p99 ms':>9}"
            print(head + f"{'cpu us/job':>12}")
            for name, batch, rate, p50, p99, cpu_us in rows:
                line = f"{name:<30}{batch:>6}{rate:>10.0f}{p50:>9.2f}{p99:>9.2f}"
                print(line + f"{cpu_us:>12.0f}")
        finally:
            cluster.destroy()


if __name__ == "__main__":
    main()
