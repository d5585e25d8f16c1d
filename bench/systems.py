"""How each system's servers are started, and what is purged before a run."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from bench.procs import PYTHON, REPO, VENV_BIN, ServerSet, base_env, find_system_pids, free_port

AMQP_URL = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


@dataclass
class Started:
    """What the producer process needs: its environment, an endpoint, the PIDs to account."""

    env: dict[str, str]
    endpoint: str = ""
    roles: dict[str, list[int]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def purge_rabbit_queues(names: list[str]) -> None:
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        for name in names:
            ch = conn.channel()
            try:
                ch.queue_purge(name)
            except pika.exceptions.ChannelClosedByBroker:
                continue  # 404: the queue does not exist yet
            ch.close()
    finally:
        conn.close()


def reset_redis_keys(keys: list[str]) -> None:
    import redis

    redis.Redis.from_url(REDIS_URL).delete(*keys)


def service_roles(with_redis: bool) -> dict[str, list[int]]:
    roles = {"broker": find_system_pids("beam.smp")}
    if with_redis:
        roles["redis"] = find_system_pids("redis-server")
    return roles


def start_celery(servers: ServerSet, opts: object) -> Started:
    from bench.celery_app import DONE_KEY, QUEUE

    backend = {"redis": "redis://127.0.0.1:6379/1", "rpc": "rpc://"}[opts.celery_backend]  # type: ignore[attr-defined]
    purge_rabbit_queues([QUEUE])
    reset_redis_keys([DONE_KEY])
    env = base_env(BENCH_CELERY_BACKEND=backend, BENCH_CELERY_PREFETCH=str(opts.celery_prefetch))  # type: ignore[attr-defined]
    argv = [
        os.path.join(VENV_BIN, "celery"),
        "-A",
        "bench.celery_app",
        "worker",
        "--concurrency",
        "2",
        "--pool",
        "prefork",
        "-Q",
        QUEUE,
        "--loglevel",
        "WARNING",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-O",
        opts.celery_optimization,  # type: ignore[attr-defined]
    ]
    w = servers.start("celery-worker", "workers", argv, env)
    roles = {"workers": [w.pid], **service_roles(with_redis=True)}
    notes = [
        f"1 worker, prefork pool of 2, prefetch multiplier {opts.celery_prefetch}, "  # type: ignore[attr-defined]
        f"-O {opts.celery_optimization}, acks_late off, no gossip/mingle/heartbeat",  # type: ignore[attr-defined]
        f"noop ignore_result=True (no backend traffic); echo results via {backend}",
    ]
    return Started(env=env, roles=roles, notes=notes)


def start_dramatiq(servers: ServerSet, opts: object) -> Started:
    from bench.dramatiq_app import DONE_KEY, QUEUE

    purge_rabbit_queues([QUEUE, f"{QUEUE}.DQ", f"{QUEUE}.XQ"])
    reset_redis_keys([DONE_KEY])
    procs, threads = opts.dramatiq_layout.split("x")  # type: ignore[attr-defined]
    prefetch = opts.dramatiq_prefetch  # type: ignore[attr-defined]
    env = base_env(**({"dramatiq_queue_prefetch": str(prefetch)} if prefetch else {}))
    argv = [
        os.path.join(VENV_BIN, "dramatiq"),
        "bench.dramatiq_app",
        "--processes",
        procs,
        "--threads",
        threads,
        "--queues",
        QUEUE,
    ]
    w = servers.start("dramatiq-worker", "workers", argv, env)
    roles = {"workers": [w.pid], **service_roles(with_redis=True)}
    notes = [
        f"--processes {procs} --threads {threads}, "
        f"queue prefetch {prefetch or 'default (2 x threads)'}, no confirm_delivery",
        "noop store_results off; echo results via the Redis results backend",
    ]
    return Started(env=env, roles=roles, notes=notes)


def start_zmq(servers: ServerSet, opts: object) -> Started:
    front, back = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    env = base_env()
    mod = [PYTHON, "-m", "bench.zmq_ref"]
    f = servers.start("zmq-forwarder", "broker", mod + ["forwarder", front, back], env)
    credit = str(opts.zmq_credit)  # type: ignore[attr-defined]
    ws = [
        servers.start(f"zmq-worker{i}", "workers", mod + ["worker", back, credit], env)
        for i in range(2)
    ]
    notes = [f"ROUTER-ROUTER forwarder, 2 DEALER worker processes, {credit} READY credit(s) each"]
    return Started(
        env=env,
        endpoint=front,
        roles={"broker": [f.pid], "workers": [w.pid for w in ws]},
        notes=notes,
    )


def emq_available() -> bool:
    return os.path.exists(
        os.path.join(REPO, "emq_django", "management", "commands", "emq_broker.py")
    )


def emq_trace_env(env: dict[str, str], manage: list[str]) -> str:
    """Turn on the trace log and the job history (a fresh, migrated SQLite database)."""
    import subprocess
    import tempfile

    work = tempfile.mkdtemp(prefix="emq-bench-trace-")
    parts = os.environ.get("BENCH_EMQ_TRACE_PARTS", "trace,recorder").split(",")
    if "trace" in parts:
        env["EMQ_TRACE_DIR"] = os.path.join(work, "trace")
    if "recorder" in parts:
        env["EMQ_RECORDER"] = "emq_django.results.recorder.DatabaseRecorder"
    env["DATABASE_URL"] = f"sqlite:///{os.path.join(work, 'db.sqlite3')}"
    subprocess.run(manage + ["migrate", "--noinput", "-v0"], env=env, check=True)
    return f"on ({', '.join(parts)}): {work}"


def start_emq(servers: ServerSet, opts: object) -> Started:
    p1, p2, p3 = free_port(), free_port(), free_port()
    urls = {p: f"tcp://127.0.0.1:{p}" for p in (p1, p2, p3)}
    env = base_env(
        DJANGO_SETTINGS_MODULE="project.settings",
        EMQ_FRONTEND_BIND=urls[p1],
        EMQ_BROKER_URL=urls[p1],
        EMQ_BACKEND_BIND=urls[p2],
        EMQ_WORKER_URL=urls[p2],
        EMQ_MONITOR_BIND=urls[p3],
        EMQ_MONITOR_URL=urls[p3],
        EMQ_IMPORTS="bench.emq_bench_tasks",
        EMQ_JOURNAL_PATH=os.path.join(servers.log_dir, f"emq-journal-{p1}.sqlite3"),
    )
    manage = [PYTHON, os.path.join(REPO, "manage.py")]
    notes = ["1 broker, 1 job manager --queues bench:10 --concurrency 2"]
    env.pop("EMQ_TRACE_DIR", None)
    env["EMQ_RECORDER"] = ""  # the example project records by default
    if getattr(opts, "emq_trace", False):
        notes.append(emq_trace_env(env, manage))
    b = servers.start("emq-broker", "broker", manage + ["emq_broker"], env)
    jm = servers.start(
        "emq-jobmanager",
        "workers",
        manage + ["emq_jobmanager", "--queues", "bench:10", "--concurrency", "2"],
        env,
    )
    return Started(
        env=env, endpoint=urls[p3], roles={"broker": [b.pid], "workers": [jm.pid]}, notes=notes
    )


STARTERS = {"emq": start_emq, "celery": start_celery, "dramatiq": start_dramatiq, "zmq": start_zmq}
