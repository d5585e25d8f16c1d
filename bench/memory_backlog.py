"""The broker's memory with a large backlog, and after it drains (issue 18).

    .venv/bin/python bench/memory_backlog.py [--jobs 1000000] [--guaranteed]
        [--max-pending N] [--managers 1] [--concurrency 4] [--tail 60]
        [--json bench/results/memory-<date>-<label>.json]

Starts the real broker (``manage.py emq_broker``) on private loopback ports with
the default settings, its journal included, and no job manager. Enqueues
``--jobs`` no-op jobs with one small integer argument (``bench.memory_tasks``,
about 100 bytes of body) through ``Task.map()`` in batches, waits until the
broker has acknowledged every one, and reads the broker's RSS (VmRSS). Then
starts the job managers (``manage.py emq_jobmanager``), samples RSS every second
until all jobs succeeded, and for ``--tail`` seconds after. Prints a table.

Plain jobs (the default) are refused as ``queue-full`` past EMQ_MAX_PENDING
(100,000 by default), so the bench raises it to hold them all in memory
(``--max-pending``, default: ``--jobs`` + 10%). ``--guaranteed`` sends
guaranteed jobs under the default bound instead: past it, they wait in the
journal on disk (``spilled``) and only their ids stay in memory.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.procs import PYTHON, REPO, Server, ServerSet, base_env, free_port  # noqa: E402
from emq_django.exceptions import BrokerUnavailable  # noqa: E402

BATCH = 10_000  # jobs per Task.map() call
MB = 1024 * 1024


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--guaranteed", action="store_true", help="guaranteed jobs (journaled)")
    ap.add_argument(
        "--max-pending", type=int, default=0, help="EMQ_MAX_PENDING (default: see above)"
    )
    ap.add_argument("--managers", type=int, default=1, help="job managers draining")
    ap.add_argument("--concurrency", type=int, default=4, help="worker processes each")
    ap.add_argument("--tail", type=int, default=60, help="seconds sampled after the drain")
    ap.add_argument("--drain-timeout", type=float, default=1800.0)
    ap.add_argument("--json", default="", help="also write the samples here")
    ap.add_argument(
        "--broker-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the broker only (repeatable), e.g. PYTHONMALLOC=malloc",
    )
    return ap.parse_args(argv)


def rss(pid: int) -> int:
    """Resident set size of ``pid`` in bytes (VmRSS)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def environment(work: str, opts: argparse.Namespace) -> dict[str, str]:
    ports = [free_port() for _ in range(10)]
    urls = [f"tcp://127.0.0.1:{p}" for p in ports]
    env = base_env(
        DJANGO_SETTINGS_MODULE="project.settings",
        DATABASE_URL=f"sqlite:///{os.path.join(work, 'db.sqlite3')}",
        EMQ_FRONTEND_BIND=urls[0],
        EMQ_BROKER_URL=urls[0],
        EMQ_BACKEND_BIND=urls[1],
        EMQ_WORKER_URL=urls[1],
        EMQ_MONITOR_BIND=urls[2],
        EMQ_MONITOR_URL=urls[2],
        EMQ_MDP_BIND=urls[3],
        EMQ_PZQ_RECEIVE_BIND=urls[4],
        EMQ_PZQ_SEND_BIND=urls[5],
        EMQ_PZQ_MONITOR_BIND=urls[6],
        EMQ_BUS_SNAPSHOT_BIND=urls[7],
        EMQ_BUS_PUBLISH_BIND=urls[8],
        EMQ_BUS_COLLECT_BIND=urls[9],
        EMQ_MC0_BIND="",  # off: its default port may be taken by another broker
        EMQ_IMPORTS="bench.memory_tasks",
        EMQ_JOURNAL_PATH=os.path.join(work, "emq-journal.sqlite3"),
        EMQ_RECORDER="",  # the example project records results by default
    )
    env.pop("EMQ_TRACE_DIR", None)
    max_pending = opts.max_pending or (0 if opts.guaranteed else opts.jobs + opts.jobs // 10)
    if max_pending:
        env["EMQ_MAX_PENDING"] = str(max_pending)
    return env


def status(env: dict[str, str]) -> dict[str, Any]:
    """The broker's MONITOR JSON (raises BrokerUnavailable after 10 s)."""
    from emq_django.monitor_client import status as monitor_status

    return monitor_status(env["EMQ_MONITOR_URL"], timeout=10.0)


def rss_by_kind(pid: int) -> dict[str, int]:
    """RSS in bytes by kind of mapping: the C heap (glibc's brk heap), anonymous
    mappings (pymalloc's arenas, large allocations, libzmq's, the malloc arenas of
    other threads: the kernel merges neighbours, so they cannot be told apart
    here) and files (code, SQLite)."""
    kinds = {"C heap": 0, "anonymous": 0, "files": 0}
    kind = "files"
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if not head[0].endswith(":"):  # a mapping's first line
                name = head[5] if len(head) > 5 else ""
                if name == "[heap]":
                    kind = "C heap"
                elif not name:
                    kind = "anonymous"
                else:
                    kind = "files" if name.startswith("/") else "other"
            elif head[0] == "Rss:":
                kinds[kind] = kinds.get(kind, 0) + int(head[1]) * 1024
    return kinds


def wait_up(env: dict[str, str], broker: Server) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if not broker.alive():
            raise RuntimeError(f"the broker exited:\n{broker.log_tail()}")
        try:
            status(env)
            return
        except Exception:
            time.sleep(0.2)
    raise RuntimeError(f"the broker did not answer in 60 s:\n{broker.log_tail()}")


def enqueue(opts: argparse.Namespace) -> float:
    """Send ``opts.jobs`` jobs from this process; returns the seconds it took."""
    import django

    django.setup()
    from bench import memory_tasks
    from emq_django.client import get_client

    task = memory_tasks.idle_guaranteed if opts.guaranteed else memory_tasks.idle
    started = time.monotonic()
    for first in range(0, opts.jobs, BATCH):
        task.map([(i,) for i in range(first, min(first + BATCH, opts.jobs))])
    get_client().flush(timeout=120)  # every ACK in
    return time.monotonic() - started


def queued(doc: dict[str, Any]) -> tuple[int, int]:
    """(jobs waiting in memory, jobs spilled to the journal) in the memq queue."""
    depth = sum(q["depth"] for q in doc["queues"] if q["name"] == "memq")
    counters = doc["counters"]
    return depth, counters.get("spilled", 0)


def drain(
    env: dict[str, str], servers: ServerSet, broker: Server, opts: argparse.Namespace
) -> tuple[float, int, list[tuple[float, int, int]]]:
    """Start the job managers; wait until every job succeeded. Returns (seconds,
    peak RSS, samples of (t, RSS, succeeded))."""
    manage = [PYTHON, os.path.join(REPO, "manage.py")]
    for k in range(opts.managers):
        servers.start(
            f"jobmanager-{k}",
            "workers",
            manage
            + [
                "emq_jobmanager",
                "--queues",
                "memq:10",
                "--concurrency",
                str(opts.concurrency),
                "--name",
                f"mem{k}",
            ],
            env,
        )
    started = time.monotonic()
    samples: list[tuple[float, int, int]] = []
    peak = 0
    succeeded = 0
    while True:
        if not broker.alive():
            raise RuntimeError(f"the broker exited:\n{broker.log_tail()}")
        try:
            succeeded = status(env)["counters"]["succeeded"]
        except BrokerUnavailable:  # stalled (a WAL restart on a loaded machine): ask again
            print(f"  the monitor did not answer in 10 s at {time.monotonic() - started:.0f} s")
        now = time.monotonic() - started
        r = rss(broker.pid)
        peak = max(peak, r)
        samples.append((now, r, succeeded))
        if succeeded >= opts.jobs:
            return now, peak, samples
        if now > opts.drain_timeout:
            raise TimeoutError(f"{succeeded} of {opts.jobs} jobs done in {now:.0f} s")
        time.sleep(1.0)


def tail(broker: Server, seconds: int) -> list[tuple[float, int]]:
    """RSS every second for ``seconds`` seconds."""
    started = time.monotonic()
    samples = []
    for k in range(seconds + 1):
        samples.append((time.monotonic() - started, rss(broker.pid)))
        time.sleep(max(0.0, started + k + 1 - time.monotonic()))
    return samples


def at(samples: list[tuple[float, int]], second: float) -> int:
    """The first sample taken at or after ``second``."""
    for t, r in samples:
        if t >= second - 0.05:
            return r
    return samples[-1][1]


def main(argv: list[str]) -> int:
    opts = parse_args(argv)
    work = tempfile.mkdtemp(prefix="emq-membench-")
    env = environment(work, opts)
    os.environ.update(env)  # this process is the producer
    servers = ServerSet(os.path.join(work, "logs"))
    manage = [PYTHON, os.path.join(REPO, "manage.py")]
    try:
        broker_env = dict(env, **dict(kv.split("=", 1) for kv in opts.broker_env))
        broker = servers.start("broker", "broker", manage + ["emq_broker"], broker_env)
        wait_up(env, broker)
        idle_rss = rss(broker.pid)
        send_s = enqueue(opts)
        doc = status(env)
        depth, spilled = queued(doc)
        acked = doc["counters"]["acked"]
        queued_rss = rss(broker.pid)
        if depth + spilled < opts.jobs:
            raise RuntimeError(f"only {depth} + {spilled} spilled of {opts.jobs} jobs queued")
        drain_s, peak, drain_samples = drain(env, servers, broker, opts)
        after = tail(broker, opts.tail)
        final = status(env)
        kinds = rss_by_kind(broker.pid)
    finally:
        servers.stop_all()
    per_job = (queued_rss - idle_rss) / opts.jobs
    kind = "guaranteed" if opts.guaranteed else "plain"
    print(f"\nbroker memory, {opts.jobs:,} {kind} no-op jobs (work dir {work})")
    print(f"  EMQ_MAX_PENDING: {env.get('EMQ_MAX_PENDING', 'default (100000)')}")
    if opts.broker_env:
        print(f"  broker's environment also: {' '.join(opts.broker_env)}")
    print(
        f"  enqueued in {send_s:.1f} s; acked {acked:,}; in memory {depth:,}, spilled {spilled:,}"
    )
    print(f"  drained in {drain_s:.1f} s by {opts.managers} job manager(s) x {opts.concurrency}")
    rows = [
        ("RSS idle, before", idle_rss),
        ("RSS with the backlog queued", queued_rss),
        ("RSS peak while draining", peak),
        *(
            (f"RSS {s} s after the drain", at(after, s))
            for s in sorted({0, 10, 30, opts.tail})
            if s <= opts.tail
        ),
        ("RSS lowest after the drain", min(r for _, r in after)),
    ]
    for label, value in rows:
        print(f"  {label:<32} {value / MB:8.1f} MB")
    print(f"  {'bytes per queued job':<32} {per_job:8.0f} B")
    print(
        "  RSS by mapping at the end: "
        + ", ".join(f"{k} {v / MB:.1f} MB" for k, v in kinds.items())
    )
    print(
        "  peers dropped for missed heartbeats (peers_expired): "
        f"{final['counters'].get('peers_expired', 0)}"
    )
    memory = final.get("memory")
    if memory:
        print(f"  broker's own count after the drain: {memory}")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(
                {
                    "jobs": opts.jobs,
                    "kind": kind,
                    "max_pending": env.get("EMQ_MAX_PENDING"),
                    "idle_rss": idle_rss,
                    "queued_rss": queued_rss,
                    "bytes_per_job": per_job,
                    "peak_rss": peak,
                    "drain_seconds": drain_s,
                    "drain": drain_samples,
                    "after": after,
                    "final_status": final,
                    "rss_by_mapping": kinds,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
