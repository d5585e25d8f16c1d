"""Majordomo echo through our broker and through majortomo's own, in one run.

    .venv/bin/python bench/mdp_bench.py [--requests 40000] [--round-trips 5000]
        [--clients 2] [--window 400] [--workers 4] [--worker-sockets 8]
        [--pairs 3] [--only emq,majortomo] [--json FILE]

For each broker: start it on a fresh loopback port, start ``--workers`` worker
processes (``--worker-kind raw``: bench/mdp_echo_worker.py, plain pyzmq, each
running ``--worker-sockets`` Majordomo workers that answer at once, so that the
broker is what is measured; ``majortomo``: the released peer's own
``majortomo.echo worker``, one per process, which is slower than either
broker), then, with majortomo's framing on plain DEALERs:

- round trip: ``--round-trips`` sequential requests from this process, each
  answered before the next is sent, to each broker in turn (both stacks run
  at once for this phase: A B, B A, ...): p50 and p99 in ms;
- pipelined: ``--clients`` client processes (this file with ``--client``),
  started together once each has had an echo, each sending ``--requests /
  --clients`` requests with up to ``--window`` outstanding: replies per second
  over all of them, from the first send to the last reply.

A Majordomo worker holds one request at a time, so the requests in flight at
the workers are at most the number of worker sockets, and every request crosses
six threads' wake-ups (client, broker, worker, each with its libzmq I/O thread).
On a shared, loaded machine each wake-up can wait milliseconds for a CPU, and
throughput is then bound by latency, not by the broker: with one client (window
200) and two one-socket workers both brokers gave 1,000-2,000 requests/s with
the broker mostly idle. Defaults that keep the broker fed: 2 clients x 400
outstanding, 4 worker processes x 8 worker sockets (32 workers). For the
pipelined phase the table gives each role's CPU per request (user+sys, psutil;
clients measure their own), the broker's busy share of the wall time, and its
share spent runnable but waiting for a CPU (/proc/PID/schedstat, other
people's load): busy + waiting near 100% means the broker was the bottleneck;
the rest is time it had nothing to read. For the round-trip phase it gives each
broker's CPU per round trip (user+sys, psutil, both brokers measured over the
same interleaved phase).

The workers and clients are the same for both brokers, so what they cost per
request dilutes the ratio between the brokers (on an idle 2-core machine the
whole run is bound by the machine's CPU): they read a message of known shape
frame by frame as bytes with only its last frame as a ``zmq.Frame``, read
replies in batches and send as many requests after each batch, and the workers
sleep in a poll of their sockets' ZMQ_FDs rather than in ``zmq_poll`` (which
asks every socket for ZMQ_EVENTS, a system call each, before and after it
sleeps). See bench/mdp_echo_worker.py.

The pipelined phases run in alternation (the order swapped every pair),
``--pairs`` times, so that a machine whose speed drifts affects both alike; the
table gives the medians and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import zmq
from zmq.backend import Socket as _BackendSocket

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.procs import (  # noqa: E402
    PYTHON,
    REPO,
    ServerSet,
    base_env,
    cpu_delta,
    free_port,
    tree_cpu,
)
from emq_django.protocol import mdp  # noqa: E402

SERVICE = b"echo"
BODY = b"x" * 64
NOBLOCK = int(zmq.NOBLOCK)
SNDMORE = int(zmq.SNDMORE)
EVENTS = int(zmq.EVENTS)
POLLIN = int(zmq.POLLIN)
_send = _BackendSocket.send
_recv = _BackendSocket.recv
_get = _BackendSocket.get


def start_majortomo(servers: ServerSet, port: int) -> int:
    argv = [PYTHON, "-m", "majortomo.broker", "-b", f"tcp://127.0.0.1:{port}"]
    return servers.start("majortomo-broker", "broker", argv, base_env()).pid


def start_emq(servers: ServerSet, port: int) -> int:
    env = base_env(
        DJANGO_SETTINGS_MODULE="project.settings",
        EMQ_FRONTEND_BIND=f"tcp://127.0.0.1:{free_port()}",
        EMQ_BACKEND_BIND=f"tcp://127.0.0.1:{free_port()}",
        EMQ_MONITOR_BIND=f"tcp://127.0.0.1:{free_port()}",
        EMQ_MDP_BIND=f"tcp://127.0.0.1:{port}",
        # PZQ, the Event BUS and mc0 stay on, as by default, on private ports (on
        # their default ports they would clash with any other broker here)
        EMQ_PZQ_RECEIVE_BIND=f"tcp://127.0.0.1:{free_port()}",
        EMQ_PZQ_SEND_BIND=f"tcp://127.0.0.1:{free_port()}",
        EMQ_PZQ_MONITOR_BIND=f"tcp://127.0.0.1:{free_port()}",
        EMQ_BUS_SNAPSHOT_BIND=f"tcp://127.0.0.1:{free_port()}",
        EMQ_BUS_PUBLISH_BIND=f"tcp://127.0.0.1:{free_port()}",
        EMQ_BUS_COLLECT_BIND=f"tcp://127.0.0.1:{free_port()}",
        EMQ_MC0_BIND=f"tcp://127.0.0.1:{free_port()}",
        EMQ_JOURNAL_PATH="",
        EMQ_TRACE_DIR="",
    )
    argv = [PYTHON, os.path.join(REPO, "manage.py"), "emq_broker"]
    return servers.start("emq-broker", "broker", argv, env).pid


BROKERS: dict[str, Callable[[ServerSet, int], int]] = {
    "emq": start_emq,
    "majortomo": start_majortomo,
}


def start_workers(
    servers: ServerSet, url: str, args: argparse.Namespace, tag: str = ""
) -> list[int]:
    if args.worker_kind == "majortomo":
        argv = [PYTHON, "-m", "majortomo.echo", "-b", url, "-n", SERVICE.decode(), "worker"]
    else:
        worker = os.path.join(REPO, "bench", "mdp_echo_worker.py")
        argv = [PYTHON, worker, url, SERVICE.decode(), str(args.worker_sockets)]
    return [
        servers.start(f"{tag}-echo-worker-{i}", "workers", argv, base_env()).pid
        for i in range(args.workers)
    ]


# ---- one client ---------------------------------------------------------------------


def send_request(sock: zmq.Socket[Any], body: bytes) -> None:
    """majortomo's REQUEST (a leading empty frame on a DEALER), frame by frame."""
    _send(sock, b"", SNDMORE)
    _send(sock, mdp.CLIENT, SNDMORE)
    _send(sock, mdp.REQUEST, SNDMORE)
    _send(sock, SERVICE, SNDMORE)
    _send(sock, body, 0)


def recv_reply(sock: zmq.Socket[Any]) -> list[bytes]:
    frame = _recv(sock, 0, False)
    parts = [frame.bytes]
    while frame.more:
        frame = _recv(sock, 0, False)
        parts.append(frame.bytes)
    return parts


def connect(url: str) -> tuple[zmq.Context[Any], zmq.Socket[Any]]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.rcvhwm = sock.sndhwm = 0
    sock.connect(url)
    return ctx, sock


class BrokerDied(RuntimeError):
    """A broker exited before its first echo (a port taken meanwhile: free_port
    only says that a port was free a moment ago)."""


def wait_ready(
    sock: zmq.Socket[Any], timeout: float = 90.0, alive: Callable[[], bool] = lambda: True
) -> None:
    """Until an echo comes back: the broker is up and a worker has said READY."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise BrokerDied("the broker exited")
        send_request(sock, b"ping")
        if sock.poll(1000):
            recv_reply(sock)
            while sock.poll(300):  # echoes of earlier pings, queued before a worker came
                recv_reply(sock)
            return
    raise RuntimeError(f"no echo within {timeout:.0f} s")


def one_round_trip(sock: zmq.Socket[Any], i: int) -> float:
    """Seconds from sending request ``i`` to its reply (checked)."""
    started = time.perf_counter()
    send_request(sock, b"%d" % i)
    frames = recv_reply(sock)
    elapsed = time.perf_counter() - started
    assert frames[2] == mdp.FINAL and frames[3] == b"%d" % i, frames
    return elapsed


def round_trips(sock: zmq.Socket[Any], n: int) -> list[float]:
    return [one_round_trip(sock, i) for i in range(n)]


def recv_echo(sock: zmq.Socket[Any], flags: int = 0) -> None:
    """One echo reply, '' MDPC02 FINAL body, read as cheaply as pyzmq allows: the
    first three frames as bytes, the body as a ``zmq.Frame`` (its ``more`` says
    that nothing follows; asking RCVMORE per frame costs more); checked."""
    empty = _recv(sock, flags, True)
    header = _recv(sock, NOBLOCK, True)
    command = _recv(sock, NOBLOCK, True)
    body = _recv(sock, NOBLOCK, False)
    if body.more or command != mdp.FINAL or body.bytes != BODY or empty or header != mdp.CLIENT:
        raise AssertionError(f"not an echo: {[empty, header, command, body.bytes]}")


def pipelined(sock: zmq.Socket[Any], n: int, window: int) -> None:
    """``n`` requests, up to ``window`` outstanding. Replies are read in batches
    (all that wait, asked with ZMQ_EVENTS: cheaper than a read that raises
    ``zmq.Again``), and as many requests sent after each batch: the libzmq I/O
    thread is then woken once per batch, not once per request."""
    sent = done = 0
    while sent < n and sent < window:
        send_request(sock, BODY)
        sent += 1
    while done < n:
        recv_echo(sock)
        got = 1
        while done + got < n and _get(sock, EVENTS) & POLLIN:
            recv_echo(sock, NOBLOCK)
            got += 1
        done += got
        for _ in range(min(got, n - sent)):
            send_request(sock, BODY)
        sent = min(n, sent + got)


def client_main(url: str, n: int, window: int) -> None:
    """A pipelining client process: ``ready`` once echoed, waits for ``go`` on
    stdin, then prints its start, end (perf_counter: system-wide monotonic on
    Linux) and CPU seconds as JSON."""
    ctx, sock = connect(url)
    try:
        wait_ready(sock)
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return
        cpu0, started = time.process_time(), time.perf_counter()
        pipelined(sock, n, window)
        ended, cpu = time.perf_counter(), time.process_time() - cpu0
        print(json.dumps({"start": started, "end": ended, "cpu": cpu}), flush=True)
    finally:
        sock.close()
        ctx.term()


def run_clients(url: str, args: argparse.Namespace, pids: dict[str, list[int]]) -> dict[str, float]:
    """The pipelined phase: ``--clients`` processes at once; rate and CPU by role."""
    per_client = args.requests // args.clients
    argv = [PYTHON, os.path.abspath(__file__), "--client", url, str(per_client), str(args.window)]
    procs = [
        subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
        for _ in range(args.clients)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        spy = None
        if args.py_spy:
            spy = subprocess.Popen(
                [
                    os.path.join(os.path.dirname(PYTHON), "py-spy"),
                    "record",
                    "--pid",
                    str(pids["broker"][0]),
                    "--rate",
                    "250",
                    "--format",
                    "raw",
                    "--output",
                    args.py_spy,
                    "--nonblocking",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.0)  # attached
        before = {role: tree_cpu(ps) for role, ps in pids.items()}
        waited0 = run_queue_wait(pids["broker"][0])
        t0 = time.perf_counter()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [json.loads(p.stdout.readline()) for p in procs]  # type: ignore[union-attr]
        after = {role: tree_cpu(ps) for role, ps in pids.items()}
        waited = run_queue_wait(pids["broker"][0]) - waited0
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=30)
        for p in procs:
            p.wait(timeout=30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    start = min(r["start"] for r in results)
    wall = max(r["end"] for r in results) - start
    # a role's CPU from the go to the last reply (sampled a little wider)
    sampled = time.perf_counter() - t0
    total = per_client * args.clients
    cpu = {role: cpu_delta(before[role], after[role]) for role in pids}
    cpu["clients"] = sum(r["cpu"] for r in results)
    figures = {
        "pipelined_per_s": total / wall,
        "broker_busy": cpu["broker"] / sampled,
        "broker_starved": waited / sampled,
    }
    for role, seconds in cpu.items():
        figures[f"{role}_us"] = seconds / total * 1e6
    return figures


def run_queue_wait(pid: int) -> float:
    """Seconds ``pid`` has spent runnable but waiting for a CPU (/proc schedstat):
    on a shared machine, the time other processes took from the broker."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


# ---- the runs -----------------------------------------------------------------------


def measure_pair(
    names: list[str], args: argparse.Namespace, logs: str, pair: int
) -> dict[str, dict[str, float]]:
    """One round: every broker up with its own workers at once; the round trips
    interleaved one request at a time (A B, then B A, ...), so that both see the
    machine's load of the same moment; then each pipelined phase in turn, the
    order swapped every pair, the other stack idle meanwhile."""
    stacks: dict[str, tuple[str, int, list[int]]] = {}
    socks: dict[str, tuple[zmq.Context[Any], zmq.Socket[Any]]] = {}
    servers = ServerSet(logs)
    try:
        alive: dict[str, Callable[[], bool]] = {}
        for name in names:
            port = free_port()
            url = f"tcp://127.0.0.1:{port}"
            broker = BROKERS[name](servers, port)
            alive[name] = servers.servers[-1].alive
            stacks[name] = (url, broker, start_workers(servers, url, args, name))
        for name in names:
            socks[name] = connect(stacks[name][0])
            try:
                wait_ready(socks[name][1], alive=alive[name])
            except RuntimeError:
                for server in servers.servers:
                    print(f"--- {server.name}:\n{server.log_tail(5)}", file=sys.stderr)
                raise
            round_trips(socks[name][1], 200)  # warm-up
        times: dict[str, list[float]] = {n: [] for n in names}
        rt_before = {n: tree_cpu([stacks[n][1]]) for n in names}
        for i in range(args.round_trips):
            for name in names if i % 2 == 0 else names[::-1]:
                times[name].append(one_round_trip(socks[name][1], i))
        rt_cpu = {n: cpu_delta(rt_before[n], tree_cpu([stacks[n][1]])) for n in names}
        figures: dict[str, dict[str, float]] = {}
        for name in names if pair % 2 == 0 else names[::-1]:
            url, broker, workers = stacks[name]
            figures[name] = run_clients(url, args, {"broker": [broker], "workers": workers})
    finally:
        for ctx, sock in socks.values():
            sock.close()
            ctx.term()
        servers.stop_all()
    for name in names:
        ordered = sorted(times[name])
        figures[name] = {
            "p50_ms": statistics.median(ordered) * 1000,
            "p99_ms": ordered[int(len(ordered) * 0.99)] * 1000,
            "rt_broker_us": rt_cpu[name] / args.round_trips * 1e6,
            **figures[name],
        }
    return figures


def show(figures: dict[str, float]) -> str:
    f = figures
    return (
        f"p50 {f['p50_ms']:.3f} ms  p99 {f['p99_ms']:.3f} ms  "
        f"(broker CPU {f['rt_broker_us']:.0f} µs/round trip)  "
        f"pipelined {f['pipelined_per_s']:,.0f}/s  broker busy {f['broker_busy']:.0%} "
        f"(waiting for a CPU {f['broker_starved']:.0%})  "
        f"CPU µs/request: broker {f['broker_us']:.0f}, workers {f['workers_us']:.0f}, "
        f"clients {f['clients_us']:.0f}"
    )


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--client":
        client_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=40_000)
    parser.add_argument("--round-trips", type=int, default=5_000)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--window", type=int, default=400)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--worker-sockets", type=int, default=8)
    parser.add_argument("--worker-kind", choices=("raw", "majortomo"), default="raw")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--only", default="emq,majortomo")
    parser.add_argument("--json", help="write every run's figures here")
    parser.add_argument(
        "--py-spy",
        help="profile the broker's pipelined phase with py-spy into this file "
        "(raw collapsed stacks; with --only one broker)",
    )
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    runs: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="mdp-bench-") as logs:
        for pair in range(args.pairs):
            for attempt in range(3):
                try:
                    measured = measure_pair(names, args, logs, pair)
                    break
                except BrokerDied:
                    if attempt == 2:
                        raise
                    print("a broker did not start (a port taken?): this pair again", flush=True)
            for name in names:
                runs[name].append(measured[name])
                print(f"pair {pair + 1} {name:10s} {show(measured[name])}", flush=True)
    load = os.getloadavg()
    sockets = f" x {args.worker_sockets} sockets" if args.worker_kind == "raw" else ""
    print(
        f"\nmedians of {args.pairs} runs each ({args.workers} {args.worker_kind} worker "
        f"processes{sockets}; {args.clients} clients x window {args.window}; "
        f"load average {load[0]:.1f}):"
    )
    medians = {}
    for name in names:
        medians[name] = {k: statistics.median(r[k] for r in runs[name]) for k in runs[name][0]}
        print(f"{name:10s} {show(medians[name])}")
    if "emq" in medians and "majortomo" in medians:
        ours, theirs = medians["emq"], medians["majortomo"]
        paired = [
            a["pipelined_per_s"] / b["pipelined_per_s"]
            for a, b in zip(runs["emq"], runs["majortomo"], strict=True)
        ]
        print(
            f"\nemq / majortomo: p50 {ours['p50_ms'] / theirs['p50_ms']:.2f}x, "
            f"pipelined {ours['pipelined_per_s'] / theirs['pipelined_per_s']:.2f}x "
            f"(per pair: {', '.join(f'{r:.2f}x' for r in paired)}), "
            f"broker CPU per request {ours['broker_us'] / theirs['broker_us']:.2f}x"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "args": vars(args),
                    "started": started,
                    "load": load,
                    "runs": runs,
                    "medians": medians,
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
