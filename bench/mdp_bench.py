"""Majordomo echo through our broker and through majortomo's own, in one run.

    .venv/bin/python bench/mdp_bench.py [--requests 20000] [--round-trips 2000]
        [--workers 2] [--window 200] [--pairs 3] [--only emq,majortomo]

For each broker: start it on a fresh loopback port, start ``--workers`` echo
workers (``--worker-kind raw``: bench/mdp_echo_worker.py, plain pyzmq, which
answers at once, so that the broker is what is measured; ``majortomo``: the
released peer's own ``majortomo.echo worker``, which is slower than either
broker), then from this process, with majortomo's framing on a plain DEALER:

- round trip: ``--round-trips`` sequential requests, each answered before the
  next is sent: p50 and p99 in ms;
- pipelined: ``--requests`` requests with up to ``--window`` outstanding:
  replies per second.

The brokers run in alternation, ``--pairs`` times, so that a machine whose speed
drifts affects both alike; the table gives the medians and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import zmq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.procs import PYTHON, REPO, ServerSet, base_env, free_port  # noqa: E402
from emq_django.protocol import mdp  # noqa: E402

SERVICE = b"echo"


def start_majortomo(servers: ServerSet, port: int) -> None:
    argv = [PYTHON, "-m", "majortomo.broker", "-b", f"tcp://127.0.0.1:{port}"]
    servers.start("majortomo-broker", "broker", argv, base_env())


def start_emq(servers: ServerSet, port: int) -> None:
    env = base_env(
        DJANGO_SETTINGS_MODULE="project.settings",
        EMQ_FRONTEND_BIND=f"tcp://127.0.0.1:{free_port()}",
        EMQ_BACKEND_BIND=f"tcp://127.0.0.1:{free_port()}",
        EMQ_MONITOR_BIND=f"tcp://127.0.0.1:{free_port()}",
        EMQ_MDP_BIND=f"tcp://127.0.0.1:{port}",
        EMQ_JOURNAL_PATH="",
        EMQ_TRACE_DIR="",
    )
    argv = [PYTHON, os.path.join(REPO, "manage.py"), "emq_broker"]
    servers.start("emq-broker", "broker", argv, env)


BROKERS: dict[str, Callable[[ServerSet, int], None]] = {
    "emq": start_emq,
    "majortomo": start_majortomo,
}


def start_workers(servers: ServerSet, url: str, n: int, kind: str) -> None:
    if kind == "majortomo":
        argv = [PYTHON, "-m", "majortomo.echo", "-b", url, "-n", SERVICE.decode(), "worker"]
    else:
        argv = [PYTHON, os.path.join(REPO, "bench", "mdp_echo_worker.py"), url, SERVICE.decode()]
    for i in range(n):
        servers.start(f"echo-worker-{i}", "workers", argv, base_env())


def request(body: bytes) -> list[bytes]:
    return [b"", mdp.CLIENT, mdp.REQUEST, SERVICE, body]


def wait_ready(sock: zmq.Socket[bytes], timeout: float = 30.0) -> None:
    """Until an echo comes back: the broker is up and a worker has said READY."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sock.send_multipart(request(b"ping"))
        if sock.poll(1000):
            sock.recv_multipart()
            return
    raise RuntimeError(f"no echo within {timeout:.0f} s")


def round_trips(sock: zmq.Socket[bytes], n: int) -> list[float]:
    times = []
    for i in range(n):
        started = time.perf_counter()
        sock.send_multipart(request(b"%d" % i))
        frames = sock.recv_multipart()
        times.append(time.perf_counter() - started)
        assert frames[2] == mdp.FINAL, frames
    return times


def pipelined(sock: zmq.Socket[bytes], n: int, window: int) -> float:
    body = b"x" * 64
    sent = done = 0
    started = time.perf_counter()
    while done < n:
        while sent < n and sent - done < window:
            sock.send_multipart(request(body))
            sent += 1
        sock.recv_multipart()
        done += 1
    return n / (time.perf_counter() - started)


def measure(name: str, args: argparse.Namespace, logs: str) -> dict[str, float]:
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    servers = ServerSet(logs)
    BROKERS[name](servers, port)
    start_workers(servers, url, args.workers, args.worker_kind)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(url)
    try:
        wait_ready(sock)
        round_trips(sock, 200)  # warm-up
        times = sorted(round_trips(sock, args.round_trips))
        rate = pipelined(sock, args.requests, args.window)
    finally:
        sock.close()
        ctx.term()
        servers.stop_all()
    return {
        "p50_ms": statistics.median(times) * 1000,
        "p99_ms": times[int(len(times) * 0.99)] * 1000,
        "pipelined_per_s": rate,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--round-trips", type=int, default=2_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--worker-kind", choices=("raw", "majortomo"), default="raw")
    parser.add_argument("--window", type=int, default=200)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--only", default="emq,majortomo")
    parser.add_argument("--json", help="write every run's figures here")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="mdp-bench-") as logs:
        for pair in range(args.pairs):
            for name in names:
                figures = measure(name, args, logs)
                runs[name].append(figures)
                p50, p99, rate = (figures[k] for k in ("p50_ms", "p99_ms", "pipelined_per_s"))
                print(
                    f"pair {pair + 1} {name:10s} p50 {p50:.3f} ms  p99 {p99:.3f} ms  "
                    f"pipelined {rate:,.0f}/s",
                    flush=True,
                )
    print(f"\nmedians of {args.pairs} runs each ({args.workers} {args.worker_kind} echo workers):")
    print(f"{'broker':10s} {'p50 ms':>8s} {'p99 ms':>8s} {'pipelined/s':>12s}")
    medians = {}
    for name in names:
        med = {k: statistics.median(r[k] for r in runs[name]) for k in runs[name][0]}
        medians[name] = med
        print(
            f"{name:10s} {med['p50_ms']:8.3f} {med['p99_ms']:8.3f} {med['pipelined_per_s']:12,.0f}"
        )
    if "emq" in medians and "majortomo" in medians:
        ours, theirs = medians["emq"], medians["majortomo"]
        print(
            f"\nemq / majortomo: p50 {ours['p50_ms'] / theirs['p50_ms']:.2f}x, "
            f"pipelined {ours['pipelined_per_s'] / theirs['pipelined_per_s']:.2f}x"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, "medians": medians}, f, indent=2)


if __name__ == "__main__":
    main()
