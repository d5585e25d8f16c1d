"""Where a queued job's memory goes: tracemalloc over the broker core, no sockets.

    .venv/bin/python bench/memory_profile.py [--jobs 200000] [--top 10] [--guaranteed]

Feeds ``--jobs`` eMQP REQUEST frames (the body ``Task.map()`` sends for
``bench.memory_tasks.idle(i)``, a client msgid of 20 characters) through the
real client port into a ``BrokerCore`` with no job manager, then prints the
bytes per queued job by the line that allocated them. Then runs them all on a
worker and prints what is left before and after ``BrokerCore.compact()``.

``--guaranteed``: guaranteed jobs under the default EMQ_MAX_PENDING, with a real
journal in a temporary directory: past the bound they are spilled to it, and
read back as the server does (``REFILL_BATCH`` at a time). Each phase also
prints the process's RSS once the C heap is trimmed, as the broker's reclaim
leaves it: the jobs' memory that tracemalloc no longer sees, but that allocator
arenas pinned by a few survivors still hold.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from emq_django.broker.core import BrokerConfig, BrokerCore  # noqa: E402
from emq_django.broker.effects import Deliver  # noqa: E402
from emq_django.broker.journal import Journal  # noqa: E402
from emq_django.broker.memory import rss_bytes, trim_heap  # noqa: E402
from emq_django.broker.ports.emqp_clients import EmqpClientPort  # noqa: E402
from emq_django.broker.ports.emqp_workers import EmqpWorkerPort  # noqa: E402
from emq_django.broker.server import REFILL_BATCH  # noqa: E402
from emq_django.ids import IdGenerator  # noqa: E402
from emq_django.protocol import PROTOCOL  # noqa: E402
from emq_django.protocol import frames as F  # noqa: E402

HEADERS = b"task:bench.memory_tasks.idle"
GUARANTEED = b"guarantee,task:bench.memory_tasks.idle_guaranteed"
CHUNK = 256  # jobs per loop turn (they share ``now``), as the server's


def body(i: int) -> bytes:
    return b'["run",{"callable":"idle","path":"bench.memory_tasks","args":[%d],"kwargs":{}}]' % i


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=200_000)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--guaranteed", action="store_true", help="journaled, spilled past the bound")
    opts = ap.parse_args(argv)
    n = opts.jobs
    headers = GUARANTEED if opts.guaranteed else HEADERS
    config = BrokerConfig() if opts.guaranteed else BrokerConfig(max_pending=n + 1)
    core = BrokerCore(config, 0.0)
    core.wall_offset = time.time()
    journal = None
    if opts.guaranteed:
        journal = Journal(os.path.join(tempfile.mkdtemp(prefix="emq-memprof-"), "journal.sqlite3"))
        core.life.journal_ops = []
    flush = Flusher(core, journal)
    show_rss("idle")
    clients = EmqpClientPort(core, ids=IdGenerator())
    workers = EmqpWorkerPort(core, ids=IdGenerator())
    ids = IdGenerator()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    now = 1.0
    for i in range(n):
        if i % CHUNK == 0:
            now += 0.001
            flush(now)
        frames = F.encode_request(ids.text().encode(), b"memq", headers, body(i))
        clients.handle(b"producer", frames, now)
        core.out.clear()
    flush(now)
    queued = tracemalloc.take_snapshot()
    total = sum(s.size_diff for s in queued.compare_to(before, "filename"))
    print(f"{n:,} jobs queued: {total / n:.0f} B per job traced (Python objects only)")
    for stat in queued.compare_to(before, "lineno")[: opts.top]:
        frame = stat.traceback[0]
        print(
            f"  {stat.size_diff / n:6.1f} B/job  {stat.count_diff:>9,} blocks  "
            f"{os.path.relpath(frame.filename)}:{frame.lineno}"
        )
    if journal is not None:
        print(f"  ({core.counters['spilled']:,} of them spilled to the journal)")
    show_rss("queued")
    drain(core, workers, n, now, flush)
    drained = tracemalloc.take_snapshot()
    left = sum(s.size_diff for s in drained.compare_to(before, "filename"))
    show_rss("drained")
    core.compact()
    compacted = tracemalloc.take_snapshot()
    kept = sum(s.size_diff for s in compacted.compare_to(before, "filename"))
    print(
        f"drained: {left / 2**20:.1f} MB left ({len(core.life.recent):,} ids kept for "
        f"de-duplication); after compact(): {kept / 2**20:.1f} MB"
    )
    tracemalloc.stop()
    show_rss("compacted")
    if journal is not None:
        journal.close()
    return 0


def show_rss(phase: str) -> None:
    """The process's RSS after a collection and ``malloc_trim`` (tracemalloc's own
    memory included)."""
    gc.collect()
    trim_heap()
    print(f"RSS {phase}, C heap trimmed: {rss_bytes() / 2**20:.1f} MB")


class Flusher:
    """What the server does after each loop turn: commit the journal operations,
    read spilled jobs back (``REFILL_BATCH`` at a time, as long as a queue wants
    more)."""

    def __init__(self, core: BrokerCore, journal: Journal | None) -> None:
        self.core = core
        self.journal = journal

    def __call__(self, now: float) -> None:
        life = self.core.life
        if self.journal is None:
            return
        while True:
            if life.journal_ops:
                ops, life.journal_ops = life.journal_ops, []
                self.journal.apply(ops)
            if not life.spill_requests:
                return
            names, life.spill_requests = life.spill_requests, set()
            for name in names:
                rows = self.journal.load_spilled(name, REFILL_BATCH)
                self.core.restore_spilled(name, rows, now)
                if len(rows) < REFILL_BATCH:
                    life.spill_requests.discard(name)


def drain(core: BrokerCore, workers: EmqpWorkerPort, n: int, now: float, flush: Flusher) -> None:
    """Run every job on one worker with one slot."""
    p = PROTOCOL
    workers.handle(b"w", [b"", p, b"INFORM", b"w-i", b'[[10, "memq"]]', b"worker"], now)
    workers.handle(b"w", [b"", p, b"READY", b"w-r"], now)
    for k in range(n):
        if k % CHUNK == 0:
            flush(now + 1.0)
        attempt = next(e.job.attempt_id for e in core.out if isinstance(e, Deliver))
        core.out.clear()
        reply = [b"", p, b"REPLY", b"w-%d" % k, b"null", attempt, b"ok,ready"]
        workers.handle(b"w", reply, now + 1.0)
    flush(now + 1.0)
    core.out.clear()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
