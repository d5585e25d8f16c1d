"""The broker's CPU per job alone, with a light driver in place of the producer
and the job manager, in alternating pairs of source trees.

    .venv/bin/python bench/broker_cpu.py TREE [TREE ...] [--pairs 3] [--tasks 20000]
        [--reply] [--credit 20]

Each round starts each tree's broker (``manage.py emq_broker`` of that tree, its
own venv, a journal as in ``bench/run.py``) on fresh loopback ports and drives
it from this process over raw ZeroMQ: a job manager's control connection and 2
slot connections (INFORM with the same meta as ours, credit by READY, each job
answered at once with a REPLY ``ok,ready``), and one producer that sends the
REQUESTs (the headers ``noop.delay()`` sends) with at most ``--window``
unacknowledged, as the client does. Only the broker does real work, so its CPU
per job (``/proc``, user+sys, from the first send to the last REPLY) is much
steadier than in the full benchmark. ``--reply``: the jobs ask for their result
(the results phase: the broker forwards every REPLY to the producer).
``--priority N``: each job with priority N (its queue ranked, issue 33).
``--guarantee``: guaranteed jobs (``guarantee=True``: journaled before their ACK);
with ``TREE,EMQ_JOURNAL_URL=postgresql://...`` on PostgreSQL's journal (the database
made again, empty, for each run).

``--profile DIR``: each broker runs under cProfile (``PYTHONMALLOC=malloc``, so that
it does not re-execute itself out of the profiler; stopped with SIGINT, so that
the stats are written) into ``DIR/<round>-<tree>.prof``; then the Python calls per
job of each tree and the functions whose calls per job differ most from the first
tree's (``bench/profile_diff.py``). Call counts do not depend on the machine's
load, as times do: a change of the broker's path shows on a busy machine too
(its CPU figures are then the profiler's, not the broker's).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import zmq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.procs import PROTOCOL_BINDS  # noqa: E402

PROTOCOL = b"eMQP/1.0"
CLK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of ``pid`` by name (the main thread: ``main``)."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                head, _, rest = f.read().rpartition(")")
            fields = rest.split()
        except OSError:
            continue
        name = "main" if tid == str(pid) else head.partition("(")[2]
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / CLK
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_broker(
    spec: str, work: str, profile: str = ""
) -> tuple[subprocess.Popen[bytes], str, str]:
    """``spec``: a tree, optionally followed by ``,NAME=VALUE`` pairs for its broker's
    environment (one tree twice: ``TREE TREE,EMQ_BROKER_PYTHONMALLOC=``); ``profile``:
    a cProfile stats file to run it under."""
    tree, *pairs = spec.split(",")
    front, back, mon = free_port(), free_port(), free_port()
    url = "tcp://127.0.0.1:%d"
    env = {
        **os.environ,
        "PYTHONPATH": tree,
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "EMQ_FRONTEND_BIND": url % front,
        "EMQ_BACKEND_BIND": url % back,
        "EMQ_MONITOR_BIND": url % mon,
        "EMQ_JOURNAL_PATH": os.path.join(work, f"journal-{front}.sqlite3"),
        "EMQ_RECORDER": "",
    }
    env.pop("EMQ_TRACE_DIR", None)
    env.update(pair.split("=", 1) for pair in pairs)
    # the other ports on free ports too (other brokers may hold the defaults): the
    # broker polls the same sockets as in bench/run.py
    for name in PROTOCOL_BINDS:
        env[f"EMQ_{name}"] = url % free_port()
    python = os.path.join(tree, ".venv", "bin", "python")
    profiler = ["-m", "cProfile", "-o", profile] if profile else []
    if profile:
        env["PYTHONMALLOC"] = "malloc"  # as the re-execution would, without leaving cProfile
    proc = subprocess.Popen(
        [python, *profiler, os.path.join(tree, "manage.py"), "emq_broker"],
        env=env,
        cwd=tree,
        stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(work, f"broker-{front}.log"), "wb"),
    )
    return proc, url % front, url % back


def fresh_pg(spec: str) -> None:
    """The database of the spec's ``EMQ_JOURNAL_URL`` (if any) made again, empty."""
    url = dict(p.split("=", 1) for p in spec.split(",")[1:] if "=" in p).get("EMQ_JOURNAL_URL")
    if not url:
        return
    import psycopg

    base, _, name = url.rpartition("/")
    with psycopg.connect(base + "/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


class Ids:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> bytes:
        self.n += 1
        return b"d%d" % self.n


# a valid W3C traceparent (--traceparent): with EMQ_OTEL_BROKER_SPANS and a tracer
# provider in the broker, each dispatch makes a span (broker/spans.py)
TRACEPARENT = b",traceparent:00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def one_run(
    tree: str,
    tasks: int,
    reply: bool,
    credit: int,
    window: int,
    profile: str = "",
    traced: bool = False,
    guarantee: bool = False,
    priority: int = 0,
) -> dict[str, float]:
    work = tempfile.mkdtemp(prefix="broker-cpu-")
    fresh_pg(tree)
    proc, front_url, back_url = start_broker(tree, work, profile)
    ctx = zmq.Context()
    new_id = Ids()
    try:
        manager = ctx.socket(zmq.DEALER)
        manager.connect(back_url)
        slots = [ctx.socket(zmq.DEALER) for _ in range(2)]
        for s in slots:
            s.connect(back_url)
        producer = ctx.socket(zmq.DEALER)
        producer.connect(front_url)
        queues = json.dumps([[10, "bench"]]).encode()
        name, inc = "drv", os.urandom(4).hex()
        meta = {"role": "manager", "manager": name, "incarnation": inc, "concurrency": 2}
        # the broker may not be listening yet: ZeroMQ connects when it does
        manager.send_multipart(
            [b"", PROTOCOL, b"INFORM", new_id(), queues, b"worker", json.dumps(meta).encode()]
        )
        for i, s in enumerate(slots):
            m = {"role": "slot", "manager": name, "incarnation": inc, "slot": i, "pid": 1}
            s.send_multipart(
                [b"", PROTOCOL, b"INFORM", new_id(), queues, b"worker", json.dumps(m).encode()]
            )
            for _ in range(credit):
                s.send_multipart([b"", PROTOCOL, b"READY", new_id()])
        for s in (manager, *slots):
            if not s.poll(60000):  # a loaded machine: start-up (and a re-execution) is slow
                raise SystemExit(f"{tree}: the broker did not answer the INFORM")
            s.recv_multipart()
        headers = b"reply-requested,task:bench.echo,stream" if reply else b"task:bench.noop"
        headers += TRACEPARENT if traced else b""
        if guarantee:
            headers += b",guarantee"
        if priority:
            headers += b",priority:%d" % priority
        body = b'[["bench.noop"],{"args":[],"kwargs":{}}]'
        poller = zmq.Poller()
        for s in (producer, *slots):
            poller.register(s, zmq.POLLIN)
        sent = acked = done = answered = 0
        noblock = zmq.NOBLOCK
        start_cpu = cpu_seconds(proc.pid)
        start_threads = thread_cpu(proc.pid)
        t0 = time.perf_counter()
        next_beat = 0.0
        while done < tasks or acked < tasks or (reply and answered < tasks):
            if time.monotonic() >= next_beat:  # or the broker drops our job manager
                next_beat = time.monotonic() + 0.5
                for s in (manager, *slots):
                    s.send_multipart([b"", PROTOCOL, b"HEARTBEAT", new_id(), b"%f" % time.time()])
            while sent < tasks and sent - acked < window:
                producer.send_multipart(
                    [b"", PROTOCOL, b"REQUEST", b"j%d" % sent, b"bench", headers, body]
                )
                sent += 1
            ready = poller.poll(10000)
            if not ready:
                raise SystemExit(f"{tree}: stuck at {sent} sent, {acked} acked, {done} run")
            for sock, _ in ready:
                while True:
                    try:
                        frames = sock.recv_multipart(noblock)
                    except zmq.Again:
                        break
                    cmd = frames[2]
                    if sock is producer:
                        if cmd == b"ACK":
                            acked += 1
                        elif cmd == b"REPLY":
                            answered += 1
                    elif cmd == b"REQUEST":
                        done += 1
                        sock.send_multipart(
                            [b"", PROTOCOL, b"REPLY", new_id(), frames[6], frames[3], b"ok,ready"]
                        )
        elapsed = time.perf_counter() - t0
        cpu = cpu_seconds(proc.pid) - start_cpu
        threads = thread_cpu(proc.pid)
        figures = {"cpu_us": cpu / tasks * 1e6, "per_s": tasks / elapsed}
        for name, seconds in threads.items():
            figures[f"thread {name}"] = (seconds - start_threads.get(name, 0.0)) / tasks * 1e6
        return figures
    finally:
        if profile:
            proc.send_signal(signal.SIGINT)  # a clean exit: cProfile writes its stats
        else:
            proc.terminate()
        try:
            proc.wait(60 if profile else 10)
        except subprocess.TimeoutExpired:
            proc.kill()
        ctx.destroy(linger=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=20000)
    ap.add_argument("--credit", type=int, default=20, help="READYs per slot at the start")
    ap.add_argument("--window", type=int, default=1000, help="unacknowledged REQUESTs at most")
    ap.add_argument("--reply", action="store_true")
    ap.add_argument("--guarantee", action="store_true", help="guaranteed jobs (journaled)")
    ap.add_argument("--priority", type=int, default=0, help="each job's priority (a ranked queue)")
    ap.add_argument("--profile", default="", help="a directory: run the brokers under cProfile")
    ap.add_argument(
        "--traceparent",
        action="store_true",
        help="each job with a traceparent header (for EMQ_OTEL_BROKER_SPANS: give the "
        "broker a tracer provider, e.g. TREE,DJANGO_SETTINGS_MODULE=bench.otel_settings)",
    )
    opts = ap.parse_args()
    if opts.profile:
        os.makedirs(opts.profile, exist_ok=True)
    runs: dict[str, list[dict[str, float]]] = {t: [] for t in opts.trees}
    for i in range(opts.pairs):
        for tree in opts.trees:
            stats = profile_file(opts.profile, i, tree) if opts.profile else ""
            r = one_run(
                tree,
                opts.tasks,
                opts.reply,
                opts.credit,
                opts.window,
                stats,
                opts.traceparent,
                opts.guarantee,
                opts.priority,
            )
            runs[tree].append(r)
            load = os.getloadavg()[0]
            print(
                f"round {i + 1} {tree}: broker {r['cpu_us']:.1f} us/job, "
                f"{r['per_s']:.0f} jobs/s (load {load:.2f}); by thread: "
                + ", ".join(f"{k[7:]} {v:.1f}" for k, v in r.items() if k.startswith("thread ")),
                flush=True,
            )
    base = statistics.median(r["cpu_us"] for r in runs[opts.trees[0]])
    for tree, rs in runs.items():
        med = statistics.median(r["cpu_us"] for r in rs)
        print(f"median {tree}: {med:.1f} us/job ({med / base:.2f}x the first tree)")
    if opts.profile:
        from bench.profile_diff import report

        files = {t: [profile_file(opts.profile, i, t) for i in range(opts.pairs)] for t in runs}
        print("\n".join(report(files, opts.tasks * opts.pairs)))
    sys.stdout.flush()


def profile_file(directory: str, round_no: int, tree: str) -> str:
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in tree.strip("/"))
    return os.path.join(directory, f"{round_no + 1}-{name}.prof")


if __name__ == "__main__":
    main()
