"""How long a job waits between ``delay()`` and a worker, when it follows a slower
job with a reply by ``--gap`` ms (session 27: while the broker holds that job's
ACK, our client coalesces the next send, up to 2 ms).

    .venv/bin/python bench/send_gap.py [--gap 0.5] [--rounds 300] [--slow-ms 5]

Starts emq as ``bench/run.py`` does; each round sends ``sleepy(slow_ms)``, sleeps
``--gap`` ms, sends ``stamp()`` (which returns the worker's ``time.monotonic()``),
waits 20 ms without reading anything, then gets both. Prints the p50 and p90 of
start - send for ``stamp()``. Needs 2 worker processes (the harness's layout), so
that ``stamp()`` never waits behind ``sleepy()``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.systems import running  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gap", type=float, default=0.5, help="ms between the two sends")
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--slow-ms", type=float, default=5.0)
    args = ap.parse_args()
    with running("emq", "emq-gap-"):
        import django

        django.setup()
        from bench import emq_bench_tasks as t

        for _ in range(20):
            t.stamp.delay().get(timeout=30)
        waits = []
        for _ in range(args.rounds):
            slow = t.sleepy.delay(args.slow_ms)
            time.sleep(args.gap / 1000)
            sent = time.monotonic()
            handle = t.stamp.delay()
            time.sleep(0.02)
            started_at = handle.get(timeout=30)
            slow.get(timeout=30)
            waits.append(started_at - sent)
        waits.sort()
        n = len(waits)
        print(
            f"gap {args.gap} ms after a {args.slow_ms} ms job: send -> worker start "
            f"p50 {waits[n // 2] * 1e6:.0f} µs, p90 {waits[n * 9 // 10] * 1e6:.0f} µs, "
            f"max {waits[-1] * 1e6:.0f} µs",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
