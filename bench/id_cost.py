"""What unguessable ids cost: the old id generator (a per-process random prefix and
a counter) against emq_django.ids (128 bits from os.urandom, drawn in blocks).

    .venv/bin/python bench/id_cost.py [--rounds 6] [--delays 5000]

1. ns per id, each generator alone, in alternating rounds (median of rounds).
2. µs per ``task.delay()`` (fire-and-forget, reply=False) to a real broker
   (``manage.py emq_broker`` on private loopback ports, its journal in a temporary
   directory), the process's client using one generator then the other, in
   alternating rounds. Prints both sides of each ratio.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import timeit

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class OldIdGenerator:
    """The generator emq_django.ids had before: 12 random hex digits, then a counter."""

    __slots__ = ("_prefix", "_n", "_ready")

    def __init__(self) -> None:
        self._prefix = os.urandom(6).hex().encode()
        self._n = 0
        # the client takes an id from here when there is one (ids.IdGenerator's
        # block); always empty, so that it calls the generator
        self._ready: list[bytes] = []

    def __call__(self) -> bytes:
        self._n += 1
        return b"%s%08x" % (self._prefix, self._n)

    def text(self) -> str:
        return self().decode()


def per_id(rounds: int) -> None:
    from emq_django.ids import IdGenerator

    sides: dict[str, list[float]] = {"old": [], "new": []}
    for _ in range(rounds):
        for name, gen in (("old", OldIdGenerator()), ("new", IdGenerator())):
            sides[name].append(min(timeit.repeat(gen, number=100_000, repeat=3)) / 100_000)
    old, new = (statistics.median(sides[k]) * 1e9 for k in ("old", "new"))
    print(f"per id: old {old:.0f} ns, new {new:.0f} ns, new/old {new / old:.2f}")


def per_delay(rounds: int, delays: int) -> None:
    import django

    from emq_django.client import get_client
    from emq_django.ids import IdGenerator

    django.setup()
    from bench.emq_bench_tasks import noop

    client = get_client()
    noop.delay()  # the first message waits for the broker's ACK
    sides: dict[str, list[float]] = {"old": [], "new": []}
    for _ in range(rounds):
        for name, gen in (("old", OldIdGenerator()), ("new", IdGenerator())):
            client._ids = gen  # type: ignore[assignment]
            start = time.perf_counter()
            for _ in range(delays):
                noop.delay()
            sides[name].append((time.perf_counter() - start) / delays)
    old, new = (statistics.median(sides[k]) * 1e6 for k in ("old", "new"))
    print(
        f"per delay(): old ids {old:.1f} µs, new ids {new:.1f} µs, new/old {new / old:.3f} "
        f"(rounds old {[round(x * 1e6, 1) for x in sides['old']]}, "
        f"new {[round(x * 1e6, 1) for x in sides['new']]})"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--delays", type=int, default=5000)
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    per_id(args.rounds)
    from bench.procs import free_ports

    ports = free_ports(7)
    names = ("FRONTEND", "BACKEND", "MONITOR", "MDP", "PZQ_RECEIVE", "PZQ_SEND", "PZQ_MONITOR")
    with tempfile.TemporaryDirectory() as tmp:
        env = {f"EMQ_{n}_BIND": f"tcp://127.0.0.1:{p}" for n, p in zip(names, ports, strict=True)}
        env.update(
            EMQ_BROKER_URL=f"tcp://127.0.0.1:{ports[0]}",
            EMQ_JOURNAL_PATH=os.path.join(tmp, "journal.sqlite3"),
            EMQ_MAX_PENDING=str(2 * args.rounds * args.delays + 10),
        )
        os.environ.update(env)
        broker = subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "manage.py"), "emq_broker"],
            env=os.environ.copy(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", ports[0]), timeout=0.2).close()
                    break
                except OSError:
                    time.sleep(0.1)
            per_delay(args.rounds, args.delays)
        finally:
            broker.terminate()
            broker.wait(timeout=30)


if __name__ == "__main__":
    main()
