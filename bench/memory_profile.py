"""Where a queued job's memory goes: tracemalloc over the broker core, no sockets.

    .venv/bin/python bench/memory_profile.py [--jobs 200000] [--top 10]

Feeds ``--jobs`` eMQP REQUEST frames (the body ``Task.map()`` sends for
``bench.memory_tasks.idle(i)``, a client msgid of 20 characters) through the
real client port into a ``BrokerCore`` with no job manager, then prints the
bytes per queued job by the line that allocated them. Then runs them all on a
worker and prints what is left before and after ``BrokerCore.compact()``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import tracemalloc

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from emq_django.broker.core import BrokerConfig, BrokerCore  # noqa: E402
from emq_django.broker.effects import Deliver  # noqa: E402
from emq_django.broker.ports.emqp_clients import EmqpClientPort  # noqa: E402
from emq_django.broker.ports.emqp_workers import EmqpWorkerPort  # noqa: E402
from emq_django.ids import IdGenerator  # noqa: E402
from emq_django.protocol import PROTOCOL  # noqa: E402
from emq_django.protocol import frames as F  # noqa: E402

HEADERS = b"task:bench.memory_tasks.idle"
CHUNK = 256  # jobs per loop turn (they share ``now``), as the server's


def body(i: int) -> bytes:
    return b'["run",{"callable":"idle","path":"bench.memory_tasks","args":[%d],"kwargs":{}}]' % i


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=200_000)
    ap.add_argument("--top", type=int, default=10)
    opts = ap.parse_args(argv)
    n = opts.jobs
    core = BrokerCore(BrokerConfig(max_pending=n + 1), 0.0)
    core.wall_offset = time.time()
    clients = EmqpClientPort(core, ids=IdGenerator())
    workers = EmqpWorkerPort(core, ids=IdGenerator())
    ids = IdGenerator()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    now = 1.0
    for i in range(n):
        if i % CHUNK == 0:
            now += 0.001
        frames = F.encode_request(ids.text().encode(), b"memq", HEADERS, body(i))
        clients.handle(b"producer", frames, now)
        core.out.clear()
    queued = tracemalloc.take_snapshot()
    total = sum(s.size_diff for s in queued.compare_to(before, "filename"))
    print(f"{n:,} jobs queued: {total / n:.0f} B per job traced (Python objects only)")
    for stat in queued.compare_to(before, "lineno")[: opts.top]:
        frame = stat.traceback[0]
        print(
            f"  {stat.size_diff / n:6.1f} B/job  {stat.count_diff:>9,} blocks  "
            f"{os.path.relpath(frame.filename)}:{frame.lineno}"
        )
    drain(core, workers, n, now)
    drained = tracemalloc.take_snapshot()
    left = sum(s.size_diff for s in drained.compare_to(before, "filename"))
    core.compact()
    compacted = tracemalloc.take_snapshot()
    kept = sum(s.size_diff for s in compacted.compare_to(before, "filename"))
    print(
        f"drained: {left / 2**20:.1f} MB left ({len(core.life.recent):,} ids kept for "
        f"de-duplication); after compact(): {kept / 2**20:.1f} MB"
    )
    return 0


def drain(core: BrokerCore, workers: EmqpWorkerPort, n: int, now: float) -> None:
    """Run every job on one worker with one slot."""
    p = PROTOCOL
    workers.handle(b"w", [b"", p, b"INFORM", b"w-i", b'[[10, "memq"]]', b"worker"], now)
    workers.handle(b"w", [b"", p, b"READY", b"w-r"], now)
    for k in range(n):
        attempt = next(e.job.attempt_id for e in core.out if isinstance(e, Deliver))
        core.out.clear()
        reply = [b"", p, b"REPLY", b"w-%d" % k, b"null", attempt, b"ok,ready"]
        workers.handle(b"w", reply, now + 1.0)
    core.out.clear()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
