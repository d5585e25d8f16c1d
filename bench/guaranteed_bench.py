"""Guaranteed jobs: emq's PostgreSQL journal, its SQLite journal and RabbitMQ quorum
queues, in one run.

    .venv/bin/python bench/guaranteed_bench.py [--jobs 10000] [--window 500]
        [--latency-jobs 500] [--rounds 3] [--only emq-pg,emq-sqlite,rabbitmq-qq]
        [--pg-url postgresql://postgres@127.0.0.1:5432] [--sqlite-sync full]
        [--label s32] [--json FILE]

Each round runs every system once, in alternation (who goes first alternates), on
the same work: ``--jobs`` jobs that each PUSH one completion signal
(``bench/donesignal.py``), sent with confirmations through a SLIDING window of
``--window`` unacknowledged jobs on both sides (every ACK or confirm makes room
for one more at once), run by
**2 consumers** that acknowledge each job after it ran; then ``--latency-jobs``
jobs sent one at a time, each timed until it is acknowledged
(``bench/guaranteed_clients.py`` has the producers and consumers).

- ``emq-pg``: ``manage.py emq_broker`` with ``EMQ_JOURNAL_URL`` (a fresh database per
  measurement on ``--pg-url``), one job manager with 2 worker processes; the producer
  sends a guaranteed task (``guarantee=True``): one ``Task.map()`` of all the phase's
  calls, which keeps at most ``EMQ_ACK_WINDOW=--window`` of them unacknowledged and
  returns once the broker ACKed them all (each ACK after the journal's commit), and
  ``delay()``, which returns after its ACK.
- ``emq-sqlite``: the same with the SQLite journal (a fresh file,
  ``EMQ_JOURNAL_SYNC=--sqlite-sync``; ``full`` fsyncs every commit, as PostgreSQL's
  ``synchronous_commit=on`` and RabbitMQ's confirms do).
- ``rabbitmq-qq``: RabbitMQ (``BENCH_AMQP_URL``) with a durable quorum queue, pika:
  persistent messages with publisher confirms (a sliding window of ``--window``
  unconfirmed), 2 consumer processes with manual acks (``basic_qos`` prefetch
  ``--prefetch``).

The figures: jobs/s from the first send to the last job run; confirmed/s (until every
job of the phase was confirmed); the acknowledgement latency's p50/p99 (ms); the CPU
per job of the broker role (our broker and the PostgreSQL backends serving its
database; RabbitMQ's ``beam.smp``) and of the clients. The medians over the rounds
and their ratios go to ``bench/results/guaranteed-<date>-<label>.json``.
"""

from __future__ import annotations

import argparse
import atexit
import datetime as dt
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.guaranteed_clients import AMQP_URL, declare_quorum_queue  # noqa: E402
from bench.procs import (  # noqa: E402
    PYTHON,
    REPO,
    ServerSet,
    base_env,
    cpu_delta,
    find_system_pids,
    free_port,
    free_ports,
    private_protocol_ports,
    tree_cpu,
)
from bench.results_path import result_path  # noqa: E402

PG_URL = os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432")
# one of its own per run: two runs at once (two sessions) must not drop each other's
PG_DB = f"emq_bench_guaranteed_{os.getpid()}"
SYSTEMS = ("emq-pg", "emq-sqlite", "rabbitmq-qq")
RATIOS = (("emq-pg", "rabbitmq-qq"), ("emq-sqlite", "rabbitmq-qq"), ("emq-pg", "emq-sqlite"))
CLIENTS = [PYTHON, "-m", "bench.guaranteed_clients"]


def pg_journal_available() -> bool:
    """The PostgreSQL journal is there (its setting is declared)."""
    registry = os.path.join(REPO, "emq_django", "settings_registry.py")
    with open(registry) as f:
        return "JOURNAL_URL" in f.read()


def fresh_database(server_url: str, synchronous_commit: str = "") -> str:
    """An empty database ``PG_DB`` on the server (dropped first), with its own
    ``synchronous_commit`` when given; its URL."""
    import psycopg

    with psycopg.connect(f"{server_url}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {PG_DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {PG_DB}")
        if synchronous_commit:
            conn.execute(f"ALTER DATABASE {PG_DB} SET synchronous_commit = '{synchronous_commit}'")
    atexit.register(drop_database, server_url)
    return f"{server_url}/{PG_DB}"


def drop_database(server_url: str) -> None:
    """The run's database, dropped when the run ends (each run has its own)."""
    import psycopg

    try:
        with psycopg.connect(f"{server_url}/postgres", autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {PG_DB} WITH (FORCE)")
    except psycopg.Error as exc:
        print(f"could not drop the benchmark's database {PG_DB}: {exc}", file=sys.stderr)


def pg_backends(server_url: str) -> list[int]:
    """The PostgreSQL backends serving the benchmark's database (the broker's)."""
    import psycopg

    with psycopg.connect(f"{server_url}/postgres", autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s", (PG_DB,)
        ).fetchall()
    return [int(r[0]) for r in rows]


def pg_settings(server_url: str) -> dict[str, str]:
    import psycopg

    names = ("server_version", "synchronous_commit", "fsync", "wal_sync_method")
    with psycopg.connect(f"{server_url}/postgres", autocommit=True) as conn:
        return {n: str(conn.execute(f"SHOW {n}").fetchone()[0]) for n in names}  # type: ignore[index]


def wait_port(port: int, alive: Callable[[], bool], timeout: float = 60.0) -> None:
    """Until something accepts TCP connections on the loopback port (the active
    broker binds its frontend only once it holds the lease); RuntimeError when the
    process exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"exited before port {port} opened")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"port {port} never opened")


# ---- the systems' servers --------------------------------------------------------------


def start_emq(servers: ServerSet, args: argparse.Namespace, journal: dict[str, str]) -> dict:
    """The broker and the job manager; tried again on fresh ports when the broker
    could not bind one (another program took it between our choice and its bind)."""
    for attempt in range(3):
        try:
            return start_emq_once(servers, args, journal)
        except RuntimeError as exc:
            if attempt == 2 or "Address already in use" not in servers.servers[-1].log_tail():
                raise RuntimeError(f"{exc}:\n{servers.servers[-1].log_tail()}") from exc
            servers.servers.pop()
    raise AssertionError("unreachable")


def start_emq_once(servers: ServerSet, args: argparse.Namespace, journal: dict[str, str]) -> dict:
    front, back, monitor = free_ports(3)
    env = base_env(
        BENCH_DONE_URL=args.done_url,
        DJANGO_SETTINGS_MODULE="project.settings",
        EMQ_FRONTEND_BIND=f"tcp://127.0.0.1:{front}",
        EMQ_BROKER_URL=f"tcp://127.0.0.1:{front}",
        EMQ_BACKEND_BIND=f"tcp://127.0.0.1:{back}",
        EMQ_WORKER_URL=f"tcp://127.0.0.1:{back}",
        EMQ_MONITOR_BIND=f"tcp://127.0.0.1:{monitor}",
        EMQ_MONITOR_URL=f"tcp://127.0.0.1:{monitor}",
        EMQ_IMPORTS="bench.emq_bench_tasks",
        EMQ_RECORDER="",
        EMQ_TRACE_DIR="",
        EMQ_ACK_WINDOW=str(args.window),  # map()'s sliding window, as RabbitMQ's
        **private_protocol_ports((front, back, monitor)),
        **journal,
    )
    manage = [PYTHON, os.path.join(REPO, "manage.py")]
    broker = servers.start("emq-broker", "broker", [*manage, "emq_broker"], env)
    wait_port(front, broker.alive)
    argv = [*manage, "emq_jobmanager", "--queues", "bench:10", "--concurrency", "2"]
    jm = servers.start("emq-jobmanager", "workers", argv, env)
    wait_output(jm.log_path, "worker processes on queues", jm.alive)  # its start-up is not counted
    return {"env": env, "producer": "emq-producer", "broker": [broker.pid], "workers": [jm.pid]}


def start_emq_pg(servers: ServerSet, args: argparse.Namespace) -> dict:
    url = fresh_database(args.pg_url, args.pg_synchronous_commit)
    started = start_emq(servers, args, {"EMQ_JOURNAL_URL": url, "EMQ_JOURNAL_PATH": ""})
    started["pg"] = pg_backends(args.pg_url)
    started["broker"] += started["pg"]
    return started


def start_emq_sqlite(servers: ServerSet, args: argparse.Namespace) -> dict:
    path = os.path.join(servers.log_dir, f"journal-{time.monotonic_ns()}.sqlite3")
    journal = {"EMQ_JOURNAL_PATH": path, "EMQ_JOURNAL_SYNC": args.sqlite_sync}
    return start_emq(servers, args, journal)


def start_rabbitmq(servers: ServerSet, args: argparse.Namespace) -> dict:
    declare_quorum_queue()
    env = base_env(BENCH_DONE_URL=args.done_url)
    argv = [*CLIENTS, "rabbit-consumer", "--prefetch", str(args.prefetch)]
    consumers = [servers.start(f"rabbit-consumer-{i}", "workers", argv, env) for i in range(2)]
    for consumer in consumers:
        wait_output(consumer.log_path, "ready", consumer.alive)
    return {
        "env": env,
        "producer": "rabbit-producer",
        "broker": find_system_pids("beam.smp"),
        "workers": [c.pid for c in consumers],
    }


STARTERS: dict[str, Callable[[ServerSet, argparse.Namespace], dict]] = {
    "emq-pg": start_emq_pg,
    "emq-sqlite": start_emq_sqlite,
    "rabbitmq-qq": start_rabbitmq,
}


def wait_output(path: str, text: str, alive: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(path, errors="replace") as f:
            if text in f.read():
                return
        if not alive():
            raise RuntimeError(f"{path}: exited before {text!r}")
        time.sleep(0.05)
    raise RuntimeError(f"{path}: no {text!r} in {timeout:.0f} s")


# ---- one measurement -------------------------------------------------------------------


def measure(name: str, args: argparse.Namespace, logs: str) -> dict[str, Any]:
    servers = ServerSet(os.path.join(logs, f"{name}-{time.monotonic_ns()}"))
    load_before = os.getloadavg()[0]
    try:
        pull, control = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
        servers.start("sink", "harness", [PYTHON, "-m", "bench.sink", pull, control], base_env())
        args.done_url = pull
        started = STARTERS[name](servers, args)
        broker_cpu = tree_cpu(started["broker"])
        pg_cpu = tree_cpu(started.get("pg", []))
        workers_cpu = tree_cpu(started["workers"])
        out = os.path.join(servers.log_dir, "figures.json")
        argv = [*CLIENTS, started["producer"], "--sink", control, "--out", out]
        argv += ["--jobs", str(args.jobs), "--window", str(args.window)]
        argv += ["--latency-jobs", str(args.latency_jobs), "--warmup", str(args.warmup)]
        producer = servers.start("producer", "producer", argv, started["env"])
        code = producer.popen.wait(timeout=args.timeout)
        if code != 0:
            tails = "\n".join(f"--- {s.name}\n{s.log_tail()}" for s in servers.servers)
            raise RuntimeError(f"{name}: the producer exited with {code}\n{tails}")
        broker_s = cpu_delta(broker_cpu, tree_cpu(started["broker"]))
        pg_s = cpu_delta(pg_cpu, tree_cpu(started.get("pg", [])))
        workers_s = cpu_delta(workers_cpu, tree_cpu(started["workers"]))
        with open(out) as f:
            figures: dict[str, Any] = json.load(f)
    finally:
        servers.stop_all()
    total = args.warmup + args.jobs + args.latency_jobs
    figures["broker_cpu_us_per_job"] = broker_s / total * 1e6
    figures["consumers_cpu_us_per_job"] = workers_s / total * 1e6
    if pg_s:  # PostgreSQL's backends, counted in the broker's figure too
        figures["postgres_cpu_us_per_job"] = pg_s / total * 1e6
    figures["load_before"] = load_before
    return figures


def medians(runs: list[dict[str, Any]]) -> dict[str, float]:
    def med(get: Callable[[dict[str, Any]], float]) -> float:
        return statistics.median(get(r) for r in runs)

    return {
        "jobs_per_s": med(lambda r: r["jobs_per_s"]),
        "confirmed_per_s": med(lambda r: r["confirmed_per_s"]),
        "ack_p50_ms": med(lambda r: r["ack"]["p50_ms"]),
        "ack_p99_ms": med(lambda r: r["ack"]["p99_ms"]),
        "broker_cpu_us_per_job": med(lambda r: r["broker_cpu_us_per_job"]),
        "consumers_cpu_us_per_job": med(lambda r: r["consumers_cpu_us_per_job"]),
    }


def print_run(round_: int, name: str, f: dict[str, Any]) -> None:
    pg = f.get("postgres_cpu_us_per_job")
    print(
        f"round {round_} {name:12s} {f['jobs_per_s']:8,.0f} jobs/s "
        f"(confirmed {f['confirmed_per_s']:8,.0f}/s), ack p50 {f['ack']['p50_ms']:.2f} ms "
        f"p99 {f['ack']['p99_ms']:.2f} ms; CPU us/job broker {f['broker_cpu_us_per_job']:.0f}"
        + ("" if pg is None else f" (PostgreSQL {pg:.0f} of it)")
        + f", consumers {f['consumers_cpu_us_per_job']:.0f}; load {f['load_before']:.1f}",
        flush=True,
    )


def machine(args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    import pika

    info: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "python": sys.version.split()[0],
        "pika": pika.__version__,
        "loadavg_before": list(os.getloadavg()),
    }
    if "emq-pg" in names:
        info["postgresql"] = pg_settings(args.pg_url)
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--window", type=int, default=500)
    parser.add_argument("--latency-jobs", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--prefetch", type=int, default=100, help="RabbitMQ consumers' qos")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default=",".join(SYSTEMS))
    parser.add_argument("--pg-url", default=PG_URL, help="a PostgreSQL server (no database)")
    parser.add_argument(
        "--pg-synchronous-commit",
        default="",
        choices=("", "on", "remote_apply", "remote_write", "local", "off"),
        help="the benchmark database's synchronous_commit (default: the server's)",
    )
    parser.add_argument("--sqlite-sync", choices=("normal", "full"), default="full")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per measurement")
    parser.add_argument("--label", default="", help="names the result file")
    parser.add_argument("--json", default="", help="the result file (default: by the scheme)")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n]
    unknown = set(names) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown systems {sorted(unknown)}; known: {', '.join(SYSTEMS)}")
    if "emq-pg" in names and not pg_journal_available():
        print("emq-pg skipped: this tree has no PostgreSQL journal (EMQ_JOURNAL_URL)")
        names.remove("emq-pg")
    info = machine(args, names)
    print(
        f"{args.jobs:,} guaranteed jobs, window {args.window}, 2 consumers, "
        f"{args.latency_jobs} sequential for the ack latency; RabbitMQ {AMQP_URL.split('@')[-1]}; "
        f"SQLite sync {args.sqlite_sync}; PostgreSQL {info.get('postgresql', '-')}",
        flush=True,
    )
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    logs = tempfile.mkdtemp(prefix="guaranteed-bench-")
    for round_ in range(args.rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            runs[name].append(measure(name, args, logs))
            print_run(round_ + 1, name, runs[name][-1])
    info["loadavg_after"] = list(os.getloadavg())
    med = {n: medians(r) for n, r in runs.items()}
    ratios = {
        f"{a}/{b}": {
            "jobs_per_s": med[a]["jobs_per_s"] / med[b]["jobs_per_s"],
            "per_round": [
                x["jobs_per_s"] / y["jobs_per_s"] for x, y in zip(runs[a], runs[b], strict=True)
            ],
            "ack_p50": med[a]["ack_p50_ms"] / med[b]["ack_p50_ms"],
            "ack_p99": med[a]["ack_p99_ms"] / med[b]["ack_p99_ms"],
        }
        for a, b in RATIOS
        if a in med and b in med
    }
    print(f"\nmedians over {args.rounds} rounds:")
    for name, m in med.items():
        print(
            f"  {name:12s} {m['jobs_per_s']:8,.0f} jobs/s, "
            f"confirmed {m['confirmed_per_s']:8,.0f}/s, "
            f"ack p50 {m['ack_p50_ms']:.2f} ms, p99 {m['ack_p99_ms']:.2f} ms"
        )
    for pair, r in ratios.items():
        rounds = ", ".join(f"{x:.2f}" for x in r["per_round"])
        print(
            f"  {pair:24s} throughput {r['jobs_per_s']:.2f}x (rounds {rounds}); "
            f"ack p50 {r['ack_p50']:.2f}x, p99 {r['ack_p99']:.2f}x"
        )
    doc = {
        "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "params": {k: v for k, v in vars(args).items() if k != "done_url"} | {"systems": names},
        "machine": info,
        "runs": runs,
        "medians": med,
        "ratios": ratios,
        "logs": logs,
    }
    path = args.json or str(result_path("guaranteed", args.label))
    with open(path, "w") as f:
        json.dump(doc, f, indent=2)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
