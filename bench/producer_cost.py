"""What one pipelined ``noop.delay()`` costs the producer process (issue 18).

    .venv/bin/python bench/producer_cost.py [TREE ...] [--jobs 100000] [--rounds 4]
        [--profile FILE] [--py-spy FILE]

A real broker (``manage.py emq_broker`` of the first tree, on private loopback
ports, its journal in a temporary directory, no job manager: nothing runs the
jobs; with ``--workers``, one job manager with 2 worker processes runs them, as
in bench/run.py, and the no-op's completion signals go to a sink here) takes
``--jobs`` ``noop.delay()`` calls from one producer process per round and tree,
the trees alternating (``A B A B ...``) so that a machine whose speed drifts
affects each alike. Each tree's producer runs its own code (its tree first on
``PYTHONPATH``). Per round and tree it prints µs per job of:

- ``cpu``: ``time.process_time()`` of the producer process (every thread: the
  caller's, the client's flusher, libzmq's I/O thread), over the ``delay()``
  calls and the ``flush()`` that waits for the broker's last ACK: what
  ``bench/clients.py`` counts as the producer's CPU;
- ``main``: ``time.thread_time()`` of the calling thread alone;
- ``wall``: elapsed time over the same span.

``--map``: one ``noop.map()`` of the ``--jobs`` calls instead (the batch path:
``send_batch`` and its ACK window).

``--results`` (with a job manager): ``echo.delay(i)`` calls, then each result's
``get()``, as bench/run.py's results phase; ``main_delay`` is then the sends'.

Then the medians per tree and, with two trees, their ratio (B / A).

``--profile FILE``: one more producer of the last tree under cProfile (its
``delay()`` calls only), the top functions by own time printed and the stats
written to FILE. ``--py-spy FILE``: one more under ``py-spy record --native``
(raw folded stacks in FILE, for a flame graph or ``sort | uniq``; PY_SPY_ARGS
replaces ``--native``, e.g. by ``--nonblocking``; PY_SPY_RATE: samples a second).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NAMES = (
    "FRONTEND",
    "BACKEND",
    "MONITOR",
    "MDP",
    "PZQ_RECEIVE",
    "PZQ_SEND",
    "PZQ_MONITOR",
    "BUS_SNAPSHOT",
    "BUS_PUBLISH",
    "BUS_COLLECT",
    "MC0",
)


# ---------------------------------------------------------------- the producer


def child(jobs: int, warmup: int, profile: str) -> None:
    """One producer: warm up, then time ``jobs`` delay() calls and the flush."""
    import django

    django.setup()
    from bench.emq_bench_tasks import noop
    from emq_django.client import get_client

    client = get_client()
    for _ in range(warmup):
        noop.delay()
    client.flush(timeout=60)
    delay = noop.delay
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
        if os.environ.get("PRODUCER_COST_RESULTS") == "1":
            from bench.emq_bench_tasks import echo

            [h.get(timeout=30) for h in [echo.delay(i) for i in range(jobs)]]
        else:
            for _ in range(jobs):
                delay()
        prof.disable()
        client.flush(timeout=120)
        prof.dump_stats(profile)
        print(json.dumps({"profiled": jobs}))
        return
    results = os.environ.get("PRODUCER_COST_RESULTS") == "1"
    if results:  # --results: echo(i) jobs, then every result's get()
        from bench.emq_bench_tasks import echo

        for i in range(20):
            assert echo.delay(i).get(timeout=30) == i
    cpu0, main0, wall0 = time.process_time(), time.thread_time(), time.perf_counter()
    if results:
        handles = [echo.delay(i) for i in range(jobs)]
        sent_main = time.thread_time()
        if [h.get(timeout=30) for h in handles] != list(range(jobs)):
            raise SystemExit("the results are not the values sent")
    elif os.environ.get("PRODUCER_COST_MAP") == "1":  # --map: one map() of them all
        noop.map([()] * jobs)
        sent_main = time.thread_time()
    else:
        for _ in range(jobs):
            delay()
        sent_main = time.thread_time()
    client.flush(timeout=120)
    cpu1, main1, wall1 = time.process_time(), time.thread_time(), time.perf_counter()
    print(
        json.dumps(
            {
                "cpu": (cpu1 - cpu0) / jobs * 1e6,
                "main": (main1 - main0) / jobs * 1e6,
                "main_delay": (sent_main - main0) / jobs * 1e6,
                "wall": (wall1 - wall0) / jobs * 1e6,
            }
        )
    )


def run_child(
    tree: str,
    env: dict[str, str],
    jobs: int,
    warmup: int,
    *extra: str,
    prefix: tuple[str, ...] = (),
) -> dict[str, float]:
    env = dict(env, PYTHONPATH=tree, DJANGO_SETTINGS_MODULE="project.settings")
    cmd = [
        *prefix,
        sys.executable,
        os.path.join(tree, "bench", "producer_cost.py")
        if os.path.exists(os.path.join(tree, "bench", "producer_cost.py"))
        else os.path.abspath(__file__),
        "--child",
        "--jobs",
        str(jobs),
        "--warmup",
        str(warmup),
        *extra,
    ]
    out = subprocess.run(cmd, env=env, cwd=tree, check=True, capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1])  # (py-spy prints its own lines too)


# ---------------------------------------------------------------- the harness


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("trees", nargs="*", help="source trees (default: this one)")
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--warmup", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--profile", default="", help="cProfile stats file (one more run)")
    ap.add_argument("--py-spy", default="", help="py-spy raw output file (one more run)")
    ap.add_argument("--json", default="", help="write the figures here")
    ap.add_argument("--workers", action="store_true", help="a job manager runs the jobs")
    ap.add_argument(
        "--results",
        action="store_true",
        help="echo(i) jobs and every result's get() (as run.py's results phase; --workers)",
    )
    ap.add_argument(
        "--map", action="store_true", help="one noop.map() of --jobs calls, not delay() each"
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.child:
        child(opts.jobs, opts.warmup, opts.profile)
        return
    trees = [os.path.abspath(t) for t in opts.trees] or [ROOT]
    labels = "ABCDEFGH"
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from bench.procs import free_ports

    ports = free_ports(len(NAMES))
    total = (opts.rounds * len(trees) + 2) * (opts.jobs + opts.warmup) + 10
    with tempfile.TemporaryDirectory(prefix="emq-producer-cost-") as tmp:
        env = dict(os.environ)
        env.update(
            {f"EMQ_{n}_BIND": f"tcp://127.0.0.1:{p}" for n, p in zip(NAMES, ports, strict=True)}
        )
        env.update(
            EMQ_BROKER_URL=f"tcp://127.0.0.1:{ports[0]}",
            EMQ_MONITOR_URL=f"tcp://127.0.0.1:{ports[2]}",
            EMQ_JOURNAL_PATH=os.path.join(tmp, "journal.sqlite3"),
            EMQ_MAX_PENDING=str(total),
            EMQ_RECORDER="",
            EMQ_IMPORTS="bench.emq_bench_tasks",
            DJANGO_SETTINGS_MODULE="project.settings",
            PYTHONPATH=trees[0],
            PYTHONUNBUFFERED="1",
        )
        env.pop("EMQ_TRACE_DIR", None)
        log = open(os.path.join(tmp, "broker.log"), "wb")
        if opts.map:
            env["PRODUCER_COST_MAP"] = "1"
        if opts.results:
            env["PRODUCER_COST_RESULTS"] = "1"
            opts.workers = True
        sink = _Sink() if opts.workers else None
        if sink is not None:
            env["BENCH_DONE_URL"] = sink.url
            env["EMQ_WORKER_URL"] = env["EMQ_BACKEND_BIND"]
        manage = [sys.executable, os.path.join(trees[0], "manage.py")]
        servers = [
            subprocess.Popen(
                manage + ["emq_broker"],
                env=env,
                cwd=trees[0],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        ]
        broker = servers[0]
        if opts.workers:
            jobmanager = ["emq_jobmanager", "--queues", "bench:10", "--concurrency", "2"]
            servers.append(
                subprocess.Popen(
                    manage + jobmanager,
                    env=env,
                    cwd=trees[0],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    socket.create_connection(("127.0.0.1", ports[0]), timeout=0.2).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or broker.poll() is not None:
                        raise SystemExit("the broker did not start") from None
                    time.sleep(0.1)
            figures = _rounds(trees, labels, env, opts)
            if opts.profile:
                run_child(trees[-1], env, opts.jobs, opts.warmup, "--profile", opts.profile)
                _print_profile(opts.profile)
            if opts.py_spy:
                spy = shutil.which("py-spy") or os.path.join(
                    os.path.dirname(sys.executable), "py-spy"
                )
                args = os.environ.get("PY_SPY_ARGS", "--native").split()
                rate = os.environ.get("PY_SPY_RATE", "500")
                prefix = (spy, "record", *args, "-r", rate, "-f", "raw", "-o", opts.py_spy, "--")
                run_child(trees[-1], env, opts.jobs, opts.warmup, prefix=prefix)
                print(f"py-spy: raw stacks in {opts.py_spy}")
        finally:
            for server in reversed(servers):  # each by its own pid
                server.terminate()
                try:
                    server.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()
            log.close()
            if sink is not None:
                sink.close()
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(figures, f, indent=2)


def _rounds(
    trees: list[str], labels: str, env: dict[str, str], opts: argparse.Namespace
) -> dict[str, object]:
    runs: dict[str, list[dict[str, float]]] = {labels[i]: [] for i in range(len(trees))}
    for i, tree in enumerate(trees):
        print(f"{labels[i]}: {tree}")
    print("round side  cpu µs/job  main  (delay only)  wall", flush=True)
    for r in range(opts.rounds):
        for i, tree in enumerate(trees):
            fig = run_child(tree, env, opts.jobs, opts.warmup)
            runs[labels[i]].append(fig)
            print(
                f"{r + 1:5d} {labels[i]:4s} {fig['cpu']:11.2f} {fig['main']:5.2f} "
                f"{fig['main_delay']:13.2f} {fig['wall']:5.2f}",
                flush=True,
            )
    medians = {
        side: {k: statistics.median(f[k] for f in figs) for k in figs[0]}
        for side, figs in runs.items()
    }
    print("median", flush=True)
    for side, m in medians.items():
        print(
            f"      {side:4s} {m['cpu']:11.2f} {m['main']:5.2f} {m['main_delay']:13.2f} "
            f"{m['wall']:5.2f}"
        )
    if len(trees) == 2:
        a, b = medians["A"], medians["B"]
        print("B/A   " + "  ".join(f"{k} {b[k] / a[k]:.3f}" for k in a))
    return {
        "trees": trees,
        "jobs": opts.jobs,
        "rounds": opts.rounds,
        "runs": runs,
        "medians": medians,
        "loadavg": os.getloadavg(),
    }


class _Sink:
    """Where the no-op jobs' completion signals go (bench/donesignal.py): read and
    dropped by a thread, so that the workers never wait on them."""

    def __init__(self) -> None:
        import threading

        import zmq

        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.LINGER, 0)
        port = self._sock.bind_to_random_port("tcp://127.0.0.1")
        self.url = f"tcp://127.0.0.1:{port}"
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            if self._sock.poll(200):
                while True:
                    try:
                        self._sock.recv(1)  # zmq.NOBLOCK
                    except Exception:
                        break

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self._sock.close()
        self._ctx.term()


def _print_profile(path: str) -> None:
    import pstats

    stats = pstats.Stats(path)
    stats.sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
