"""How each system's servers are started, and what is purged before a run.

Every system gets 2 worker processes, and its servers get the completion sink's
address (``BENCH_DONE_URL``) that the no-op task PUSHes to."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial

from bench.procs import (
    PYTHON,
    REPO,
    VENV_BIN,
    ServerSet,
    base_env,
    find_system_pids,
    free_port,
    free_ports,
    private_protocol_ports,
)

AMQP_URL = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")


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


def service_roles(rabbit: bool) -> dict[str, list[int]]:
    """The shared services a system uses, counted in its broker role: RabbitMQ's
    beam.smp (message broker) and/or redis-server (broker or result store)."""
    pids = find_system_pids("beam.smp") if rabbit else []
    return {"broker": pids + find_system_pids("redis-server")}


def env_for(opts: object, **extra: str) -> dict[str, str]:
    """The servers' environment: the completion sink's address, and ``extra``."""
    return base_env(BENCH_DONE_URL=opts.done_url, **extra)  # type: ignore[attr-defined]


def start_celery(servers: ServerSet, opts: object) -> Started:
    from bench.celery_app import QUEUE

    backend = {"redis": "redis://127.0.0.1:6379/1", "rpc": "rpc://"}[opts.celery_backend]  # type: ignore[attr-defined]
    purge_rabbit_queues([QUEUE])
    env = env_for(
        opts, BENCH_CELERY_BACKEND=backend, BENCH_CELERY_PREFETCH=str(opts.celery_prefetch)
    )  # type: ignore[attr-defined]
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
    notes = [
        f"RabbitMQ; 1 worker, prefork pool of 2, prefetch multiplier {opts.celery_prefetch}, "  # type: ignore[attr-defined]
        f"-O {opts.celery_optimization}, acks_late off, no gossip/mingle/heartbeat",  # type: ignore[attr-defined]
        f"noop ignore_result=True; echo results via {backend} (AsyncResult.get)",
    ]
    return Started(env=env, roles={"workers": [w.pid], **service_roles(rabbit=True)}, notes=notes)


def start_dramatiq(servers: ServerSet, opts: object, threads: int) -> Started:
    from bench.dramatiq_app import QUEUE

    purge_rabbit_queues([QUEUE, f"{QUEUE}.DQ", f"{QUEUE}.XQ"])
    prefetch = opts.dramatiq_prefetch  # type: ignore[attr-defined]
    env = env_for(opts, **({"dramatiq_queue_prefetch": str(prefetch)} if prefetch else {}))
    argv = [
        os.path.join(VENV_BIN, "dramatiq"),
        "bench.dramatiq_app",
        "--processes",
        "2",
        "--threads",
        str(threads),
        "--queues",
        QUEUE,
    ]
    w = servers.start(f"dramatiq-{threads}t-worker", "workers", argv, env)
    notes = [
        f"RabbitMQ; --processes 2 --threads {threads}, "
        f"queue prefetch {prefetch or 'default (2 x threads)'}, no confirm_delivery",
        "noop store_results off; echo via the Results middleware, Redis backend "
        "(message.get_result(block=True))",
    ]
    return Started(env=env, roles={"workers": [w.pid], **service_roles(rabbit=True)}, notes=notes)


def start_huey(servers: ServerSet, opts: object) -> Started:
    from bench.huey_app import huey

    huey.flush()  # this instance's queue, schedule and results
    env = env_for(opts)
    argv = [
        os.path.join(VENV_BIN, "huey_consumer"),
        "bench.huey_app.huey",
        "-k",
        "process",
        "-w",
        "2",
        "--no-periodic",
        "--quiet",
    ]
    w = servers.start("huey-consumer", "workers", argv, env)
    notes = [
        "Redis; huey_consumer -k process -w 2 --no-periodic --quiet; RedisHuey blocking=True "
        "(BRPOP), notify_result=True (result.get(blocking=True) waits on BLPOP)",
        "noop returns None (no result stored); echo via result.get(blocking=True)",
    ]
    return Started(env=env, roles={"workers": [w.pid], **service_roles(rabbit=False)}, notes=notes)


def start_rq(servers: ServerSet, opts: object) -> Started:
    from redis import Redis
    from rq import Queue

    from bench.rq_app import QUEUE, REDIS_URL

    Queue(QUEUE, connection=Redis.from_url(REDIS_URL)).empty()
    env = env_for(opts)
    argv = [
        os.path.join(VENV_BIN, "rq"),
        "worker",
        "--worker-class",
        "rq.worker.SimpleWorker",
        "--url",
        REDIS_URL,
        "--logging_level",
        "WARNING",
        "--disable-job-desc-logging",
        QUEUE,
    ]
    ws = [servers.start(f"rq-worker{i}", "workers", argv, env) for i in range(2)]
    notes = [
        "Redis; 2 processes of rq worker --worker-class rq.worker.SimpleWorker "
        "(no fork per job), logging WARNING",
        "noop enqueued with result_ttl=0 (no result kept); echo via "
        "job.latest_result(timeout=...) (blocking XREAD)",
    ]
    return Started(
        env=env, roles={"workers": [w.pid for w in ws], **service_roles(rabbit=False)}, notes=notes
    )


def start_zmq(servers: ServerSet, opts: object) -> Started:
    front, back = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    env = env_for(opts)
    mod = [PYTHON, "-m", "bench.zmq_ref"]
    f = servers.start("zmq-forwarder", "broker", mod + ["forwarder", front, back], env)
    credit = str(opts.zmq_credit)  # type: ignore[attr-defined]
    ws = [
        servers.start(f"zmq-worker{i}", "workers", mod + ["worker", back, credit], env)
        for i in range(2)
    ]
    notes = [
        f"ROUTER-ROUTER forwarder, 2 DEALER worker processes, {credit} READY credit(s) each; "
        "a no-op returns its credit with a READY, an echo with its reply"
    ]
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


def emq_curve_env(env: dict[str, str], manage: list[str]) -> tuple[dict[str, str], str]:
    """CURVE on (issue 16): a broker key pair, and one key with every role the job
    manager and the producer need, registered in a (fresh or the trace's) database.
    Returns the broker's environment (its own secret key) and a note."""
    import subprocess
    import tempfile

    work = tempfile.mkdtemp(prefix="emq-bench-curve-")
    env.setdefault("DATABASE_URL", f"sqlite:///{os.path.join(work, 'db.sqlite3')}")
    keys = os.path.join(work, "keys")
    subprocess.run(manage + ["migrate", "--noinput", "-v0"], env=env, check=True)
    for args in (["broker", "--server"], ["bench", "--roles", "client,worker,monitor,admin"]):
        subprocess.run(
            manage + ["emq_keys", "generate", *args, "--dir", keys],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
    env["EMQ_CURVE_SECRET_KEY"] = os.path.join(keys, "bench.key_secret")
    env["EMQ_CURVE_SERVER_KEY"] = os.path.join(keys, "broker.key")
    broker_env = {**env, "EMQ_CURVE_SECRET_KEY": os.path.join(keys, "broker.key_secret")}
    return broker_env, f"CURVE on every socket, ZAP allow-list in {work}"


def start_emq(servers: ServerSet, opts: object) -> Started:
    p1, p2, p3 = free_ports(3)
    urls = {p: f"tcp://127.0.0.1:{p}" for p in (p1, p2, p3)}
    env = env_for(
        opts,
        DJANGO_SETTINGS_MODULE="project.settings",
        EMQ_FRONTEND_BIND=urls[p1],
        EMQ_BROKER_URL=urls[p1],
        EMQ_BACKEND_BIND=urls[p2],
        EMQ_WORKER_URL=urls[p2],
        EMQ_MONITOR_BIND=urls[p3],
        EMQ_MONITOR_URL=urls[p3],
        EMQ_IMPORTS="bench.emq_bench_tasks",
        EMQ_JOURNAL_PATH=os.path.join(servers.log_dir, f"emq-journal-{p1}.sqlite3"),
        **private_protocol_ports((p1, p2, p3)),
    )
    manage = [PYTHON, os.path.join(REPO, "manage.py")]
    notes = [
        "1 broker, 1 job manager --queues bench:10 --concurrency 2 (2 worker processes)",
        "noop reply=False; echo via Result.get()",
    ]
    env.pop("EMQ_TRACE_DIR", None)
    env["EMQ_RECORDER"] = ""  # the example project records by default
    if getattr(opts, "emq_trace", False):
        notes.append(emq_trace_env(env, manage))
    if getattr(opts, "emq_otel", False):  # the producer and the job manager; not the broker
        env["DJANGO_SETTINGS_MODULE"] = "bench.otel_settings"
        notes.append("OpenTelemetry SDK on: batch span processor, spans dropped")
    broker_env = env
    if getattr(opts, "emq_curve", False):
        broker_env, note = emq_curve_env(env, manage)
        notes.append(note)
    broker_env = {**broker_env, "DJANGO_SETTINGS_MODULE": "project.settings"}
    b = servers.start("emq-broker", "broker", manage + ["emq_broker"], broker_env)
    jm = servers.start(
        "emq-jobmanager",
        "workers",
        manage + ["emq_jobmanager", "--queues", "bench:10", "--concurrency", "2"],
        env,
    )
    return Started(
        env=env, endpoint=urls[p3], roles={"broker": [b.pid], "workers": [jm.pid]}, notes=notes
    )


STARTERS: dict[str, Callable[[ServerSet, object], Started]] = {
    "emq": start_emq,
    "celery": start_celery,
    "dramatiq-1t": partial(start_dramatiq, threads=1),
    "dramatiq-8t": partial(start_dramatiq, threads=8),
    "huey": start_huey,
    "rq": start_rq,
    "zmq": start_zmq,
}
# The adapter in bench/clients.py that each row's producer uses.
CLIENT = {name: name.split("-")[0] for name in STARTERS}


@contextlib.contextmanager
def running(system: str, prefix: str) -> Iterator[tuple[Started, types.SimpleNamespace]]:
    """One system's servers, started as ``bench/run.py`` starts them, for a script
    that drives them from its own process (``bench/rtt_cpu.py``,
    ``bench/send_gap.py``): their environment applied here, 3 s to settle. Yields
    what started and the options it was started with; stops them after."""
    servers = ServerSet(tempfile.mkdtemp(prefix=prefix))
    opts = types.SimpleNamespace(
        done_url="tcp://127.0.0.1:1",
        emq_trace=False,
        emq_curve=False,
        emq_otel=False,
        zmq_credit=100,
    )
    started = STARTERS[system](servers, opts)
    try:
        os.environ.update(started.env)
        time.sleep(3)
        yield started, opts
    finally:
        servers.stop_all()
