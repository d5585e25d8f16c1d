"""Sequential round trips of one system, and each role's CPU per round trip.

    .venv/bin/python bench/rtt_cpu.py emq [--round-trips 3000] [--repeats 2]

Starts the system's servers as ``bench/run.py`` does (``bench.systems``), sends
``--round-trips`` echo jobs one at a time through its client adapter
(``bench.clients``) after 300 to warm up, and prints per repeat the p50 round trip
and the CPU (user + system) per round trip of the client (this process) and of each
server role's process tree (psutil). Where ``bench/run.py``'s p50 line goes.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import types

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.clients import ADAPTERS  # noqa: E402
from bench.systems import STARTERS, running  # noqa: E402


def tree_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            for p in [root, *root.children(recursive=True)]:
                t = p.cpu_times()
                total += t.user + t.system
        except psutil.Error:
            pass
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("system", choices=sorted(STARTERS))
    ap.add_argument("--round-trips", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    with running(args.system, "emq-rtt-") as (started, opts):
        client = ADAPTERS[args.system](
            types.SimpleNamespace(endpoint=started.endpoint, **vars(opts))
        )
        for i in range(300):
            client.get_result(client.send_echo(i))
        me = psutil.Process()
        n = args.round_trips
        for _ in range(args.repeats):
            roles0 = {r: tree_cpu(p) for r, p in started.roles.items()}
            mine0 = me.cpu_times()
            samples = []
            for i in range(n):
                t = time.perf_counter()
                client.get_result(client.send_echo(i))
                samples.append(time.perf_counter() - t)
            mine1 = me.cpu_times()
            roles = {
                r: round((tree_cpu(p) - roles0[r]) / n * 1e6) for r, p in started.roles.items()
            }
            mine = (mine1.user + mine1.system - mine0.user - mine0.system) / n * 1e6
            samples.sort()
            print(
                f"{args.system}: p50 {samples[n // 2] * 1e6:.0f} µs; CPU µs per round trip: "
                f"client {mine:.0f}, " + ", ".join(f"{r} {v}" for r, v in roles.items()),
                flush=True,
            )
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
