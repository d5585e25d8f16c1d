"""Streamed results: the time from ``emq.partial()`` in a worker process to the
caller's ``for part in task.delay(...).stream()``, on loopback.

    .venv/bin/python bench/stream_latency.py [--partials 2000] [--gap 0.0005]
        [--runs 3] [--burst]

Starts a broker (no journal, no trace) and a job manager with one worker
process, then from this process streams ``--runs`` jobs of ``--partials``
partial results each. Every partial carries ``time.monotonic_ns()`` read just
before ``emq.partial()``; this process reads the same clock when ``stream()``
yields it (one machine: one clock). ``--gap`` spaces the partials, so each is
timed alone; ``--burst`` adds a run with no gap (partials queue behind each
other, so that figure includes waiting in line). ``--baseline`` also times, in
the same run, the same two hops with nothing but pyzmq: a worker DEALER, a
ROUTER-to-ROUTER relay process, a client DEALER (the floor on this machine now).
Prints p50/p99/max in ms, and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.procs import PYTHON, REPO, ServerSet, base_env, free_port  # noqa: E402


def start(servers: ServerSet) -> dict[str, str]:
    urls = [f"tcp://127.0.0.1:{free_port()}" for _ in range(3)]
    env = base_env(
        DJANGO_SETTINGS_MODULE="project.settings",
        EMQ_FRONTEND_BIND=urls[0],
        EMQ_BROKER_URL=urls[0],
        EMQ_BACKEND_BIND=urls[1],
        EMQ_WORKER_URL=urls[1],
        EMQ_MONITOR_BIND=urls[2],
        EMQ_MONITOR_URL=urls[2],
        EMQ_IMPORTS="bench.stream_tasks",
        EMQ_JOURNAL_PATH="",
        EMQ_RECORDER="",
    )
    env.pop("EMQ_TRACE_DIR", None)
    manage = [PYTHON, os.path.join(REPO, "manage.py")]
    servers.start("emq-broker", "broker", [*manage, "emq_broker"], env)
    jm = [*manage, "emq_jobmanager", "--queues", "stream:10", "--concurrency", "1"]
    servers.start("emq-jobmanager", "workers", jm, env)
    os.environ.update({k: v for k, v in env.items() if k.startswith(("EMQ_", "DJANGO_"))})
    os.environ.pop("EMQ_TRACE_DIR", None)
    return env


def run(partials: int, gap: float) -> list[float]:
    """One streamed job: each partial's lag in ms, in order."""
    from bench.stream_tasks import stamps

    lags = []
    result = stamps.delay(partials, gap)
    for value in result.stream(timeout=60):
        now = time.monotonic_ns()
        lags.append((now - value) / 1e6)
    final = lags.pop()  # the return value is a count, not a time
    assert final is not None and len(lags) == partials, (len(lags), partials)
    return lags


def relay(front: str, back: str) -> None:
    """The baseline's broker: stamps from the worker to the client, as they come."""
    import zmq

    ctx = zmq.Context()
    fsock, bsock = ctx.socket(zmq.ROUTER), ctx.socket(zmq.ROUTER)
    fsock.bind(front)
    bsock.bind(back)
    poller = zmq.Poller()
    poller.register(fsock, zmq.POLLIN)
    poller.register(bsock, zmq.POLLIN)
    worker = client = b""
    while True:
        for sock, _ in poller.poll():
            if sock is bsock:
                wid, payload = bsock.recv_multipart()
                if payload == b"hi":
                    worker = wid
                elif payload == b"end":
                    return
                elif client:
                    fsock.send_multipart([client, payload])
            else:
                client, payload = fsock.recv_multipart()
                if worker:
                    bsock.send_multipart([worker, payload])


def baseline_worker(back: str, n: int, gap: float) -> None:
    import zmq

    sock = zmq.Context().socket(zmq.DEALER)
    sock.connect(back)
    sock.send(b"hi")
    while sock.recv() != b"go":
        pass
    for _ in range(n):
        sock.send(b"%d" % time.monotonic_ns())
        if gap:
            time.sleep(gap)
    sock.send(b"end")
    time.sleep(0.5)


def baseline(servers: ServerSet, n: int, gap: float) -> list[float]:
    import zmq

    front, back = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    me = [PYTHON, os.path.abspath(__file__)]
    servers.start("zmq-relay", "broker", [*me, "--role", "relay", front, back], base_env())
    args = [*me, "--role", "worker", back, str(n), str(gap)]
    servers.start("zmq-worker", "workers", args, base_env())
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.connect(front)
    lags: list[float] = []
    while not lags:
        sock.send(b"go")
        if sock.poll(200):
            lags.append((time.monotonic_ns() - int(sock.recv())) / 1e6)
    while len(lags) < n:
        stamp = int(sock.recv())
        lags.append((time.monotonic_ns() - stamp) / 1e6)
    sock.close(linger=0)
    return lags


def summary(lags: list[float]) -> dict[str, float]:
    ordered = sorted(lags)
    q = statistics.quantiles(ordered, n=100, method="inclusive")
    return {
        "n": len(ordered),
        "p50_ms": round(statistics.median(ordered), 4),
        "p99_ms": round(q[98], 4),
        "max_ms": round(ordered[-1], 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partials", type=int, default=2000)
    parser.add_argument("--gap", type=float, default=0.0005, help="seconds between partials")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--burst", action="store_true", help="also a run with no gap")
    parser.add_argument("--baseline", action="store_true", help="also pyzmq alone, same hops")
    parser.add_argument("--role", nargs="+", help=argparse.SUPPRESS)  # the baseline's processes
    opts = parser.parse_args()
    if opts.role:
        if opts.role[0] == "relay":
            relay(*opts.role[1:3])
        else:
            baseline_worker(opts.role[1], int(opts.role[2]), float(opts.role[3]))
        return
    servers = ServerSet(tempfile.mkdtemp(prefix="emq-stream-bench-"))
    try:
        start(servers)
        import django

        django.setup()
        from bench.stream_tasks import stamps

        assert stamps.delay(1).get(timeout=60) == 1  # the job manager is up
        run(200, opts.gap)  # warm-up
        spaced: list[float] = []
        floor: list[float] = []
        for k in range(opts.runs):  # alternating, so that a drifting machine hits both
            lags = run(opts.partials, opts.gap)
            print(f"run {k + 1}: {summary(lags)}")
            spaced += lags
            if opts.baseline:
                floor += baseline(servers, opts.partials, opts.gap)
                print(f"run {k + 1}, pyzmq alone: {summary(floor[-opts.partials :])}")
        report = {"gap_s": opts.gap, **summary(spaced)}
        if opts.burst:
            report["burst"] = summary(run(opts.partials, 0.0))
        if opts.baseline:
            report["pyzmq_baseline"] = summary(floor)
        print(
            f"emq.partial() -> stream(): p50 {report['p50_ms']:.3f} ms, "
            f"p99 {report['p99_ms']:.3f} ms, max {report['max_ms']:.3f} ms "
            f"over {report['n']} partials ({opts.gap * 1000:g} ms apart)"
        )
        if opts.burst:
            b = report["burst"]
            print(f"burst (no gap): p50 {b['p50_ms']:.3f} ms, p99 {b['p99_ms']:.3f} ms")  # type: ignore[index]
        if opts.baseline:
            z = report["pyzmq_baseline"]
            print(
                f"pyzmq alone, same hops: p50 {z['p50_ms']:.3f} ms, "  # type: ignore[index]
                f"p99 {z['p99_ms']:.3f} ms"  # type: ignore[index]
            )
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        print("JSON=" + json.dumps(report))
    finally:
        servers.stop_all()


if __name__ == "__main__":
    main()
