"""Every ``EMQ_*`` setting with its default and meaning: the docs' settings table.

``settings_reference()`` is the one list the docs site renders
(``docs/reference/settings.md``, through ``docs/hooks.py``). The defaults come from
the code that reads the settings (``conf.EmqSettings``, ``results.conf.DEFAULTS``,
``scheduler.config.SchedulerConfig``); the meanings are kept here, beside them. A
settings registry that carries its own docs replaces ``settings_reference()`` alone.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Any


@dataclass(frozen=True, slots=True)
class SettingDoc:
    name: str  # EMQ_...
    default: str  # as the docs show it
    doc: str  # Markdown


# Defaults that the code computes, or that read better in words.
_SHOWN_DEFAULTS = {
    "EMQ_JOURNAL_PATH": "BASE_DIR/var/emq-journal.sqlite3",
    "EMQ_TOPIC_RETENTION": '{"": {"max_age": 604800, "max_count": 100000}}',
    "EMQ_IMPORTS": "empty",
}

MEANINGS: dict[str, str] = {
    "EMQ_BROKER_URL": "client -> broker frontend",
    "EMQ_WORKER_URL": "job manager -> broker backend",
    "EMQ_MONITOR_URL": "where the admin, `emq_status` and the monitor client reach the "
    "monitor channel",
    "EMQ_FRONTEND_BIND": "where the broker listens for clients",
    "EMQ_BACKEND_BIND": "where the broker listens for job managers",
    "EMQ_MONITOR_BIND": "monitor channel",
    "EMQ_MDP_BIND": "Majordomo clients and workers (`''` turns the port off)",
    "EMQ_PZQ_RECEIVE_BIND": "PZQ producers (`''` turns PZQ off)",
    "EMQ_PZQ_SEND_BIND": "PZQ consumers connect a ROUTER here",
    "EMQ_PZQ_MONITOR_BIND": "PZQ `MONITOR` (`''` leaves it out)",
    "EMQ_ALLOW_PLAINTEXT": "let the broker bind a non-loopback address without CURVE "
    "([Safe defaults](../features/security.md#safe-defaults))",
    "EMQ_PZQ_QUEUE": "the emq queue PZQ messages live in",
    "EMQ_PZQ_ACK_TIMEOUT": "seconds a consumer has to ack a delivery",
    "EMQ_PZQ_MAX_DELIVERIES": "deliveries before a message is a dead letter",
    "EMQ_PZQ_MAX_INFLIGHT": "deliveries not yet acked, over all consumers",
    "EMQ_PZQ_MAX_AGE": "seconds a message may wait before it expires (0: never)",
    "EMQ_BUS_SNAPSHOT_BIND": "Event BUS snapshot (`''` turns the Event BUS off)",
    "EMQ_BUS_PUBLISH_BIND": "Event BUS publisher (subscribers' SUB)",
    "EMQ_BUS_COLLECT_BIND": "Event BUS collector (producers' PUB)",
    "EMQ_BUS_PUBLISH_HWM": "events queued per subscriber before it misses some",
    "EMQ_BUS_CONFIRM_TIMEOUT": "seconds `emq.publish` waits for the broker's confirmation "
    "(window full, `wait_published`, exit) before `PublishUnconfirmed`",
    "EMQ_BUS_CONFIRM": "`emq.publish`'s default: confirmed batches towards emq's broker; "
    "`false` (or `publish(..., confirm=False)`) sends the Event BUS document's plain PUB, "
    "never answered, for a foreign Event BUS server such as event-bus-zeromq "
    "([Topics](../protocols/topics.md#what-emqs-own-path-promises))",
    "EMQ_BUS_BATCH_BIND": "emq's batch publisher: several events a message in a burst; "
    "`emq.subscribe` reads it when set (`''`: off)",
    "EMQ_BUS_SNAPSHOT_URL": "where `emq.subscribe` asks for snapshots (`''`: the bind address)",
    "EMQ_BUS_PUBLISH_URL": "where `emq.subscribe` takes live events (`''`: the bind address)",
    "EMQ_BUS_COLLECT_URL": "where `emq.publish` sends (`''`: the bind address)",
    "EMQ_BUS_BATCH_URL": "where `emq.subscribe` reads batches (`''`: the bind address)",
    "EMQ_TOPIC_RETENTION": "events kept, by topic prefix (dict or JSON)",
    "EMQ_MC0_BIND": "mc0 connectors (`''` turns the port off)",
    "EMQ_HEARTBEAT_INTERVAL": "seconds between heartbeats",
    "EMQ_HEARTBEAT_LIVENESS": "missed beats before a peer is dead",
    "EMQ_ACK_TIMEOUT": "seconds a client waits for the broker's ACK",
    "EMQ_ACK_WINDOW": "unacknowledged jobs a client may have in flight",
    "EMQ_MONITOR_TIMEOUT": "seconds `emq_status` waits for the monitor",
    "EMQ_EAGER": "run tasks inline in `.delay()` (tests)",
    "EMQ_IMPORTS": "extra task modules to import (a list, or comma-separated)",
    "EMQ_MAX_PENDING": "jobs waiting per queue before the broker refuses more",
    "EMQ_DEFAULT_QUEUE": "the queue of a task declared without `queue=`",
    "EMQ_PREFETCH": "most jobs one worker process holds (it adapts below this)",
    "EMQ_SHUTDOWN_GRACE": "seconds a stopping broker waits for in-flight jobs",
    "EMQ_RECORDER": "the class that records finished jobs (results and history)",
    "EMQ_RECORD_INTERVAL": "seconds between a worker process's hand-overs of records to "
    "the recorder process",
    "EMQ_RECORD_BATCH": "... or as soon as it holds this many",
    "EMQ_RECORD_BUFFER": "records a worker process keeps while its recorder process is "
    "behind or down",
    "EMQ_RECORDER_PRIORITY": "the recorder process's CPU priority: `idle` (`SCHED_IDLE`), "
    "`normal`, or a nice value 1-19",
    "EMQ_RECORDER_MAX_DELAY": "the longest the recorder process holds records back while "
    "the CPUs are busy",
    "EMQ_TRACE_DIR": "where the broker writes its trace ([trace format](../trace-format.md))",
    "EMQ_JOURNAL_PATH": "the broker's journal of guaranteed jobs (`''` turns it off); under "
    "systemd with `StateDirectory=`, `$STATE_DIRECTORY/emq-journal.sqlite3`; without "
    "`BASE_DIR` in the settings, `~/.local/state/emq-django/`",
    "EMQ_JOURNAL_SYNC": "`normal` survives a process crash, `full` also a power loss",
    "EMQ_MAX_QUEUE_BYTES": "job bodies waiting in memory per queue",
    "EMQ_MAX_BODY_BYTES": "one job's body; the broker refuses bigger ones (`body-too-big`)",
    "EMQ_RETRY_BASE": "first retry delay (doubling, +-20% jitter)",
    "EMQ_RETRY_CAP": "the longest retry delay",
    "EMQ_DEDUPE_WINDOW": "seconds a finished job's id is remembered",
    "EMQ_MAX_DEAD_LETTERS": "dead letters kept (the oldest go first)",
    "EMQ_TIME_LIMIT_GRACE": "seconds past a job's `timeout` after which the broker ends "
    "an unanswered attempt itself (keep it above `EMQ_KILL_GRACE`; "
    "[Guarantees](../features/guarantees.md))",
    "EMQ_KILL_GRACE": "seconds between SIGTERM and SIGKILL for a cancelled running job "
    "(a time limit kills at once)",
    "EMQ_CURVE_SECRET_KEY": "this process's CURVE secret key (Z85, or a key file's path); "
    "empty: plain text ([Security](../features/security.md))",
    "EMQ_CURVE_SERVER_KEY": "the broker's CURVE public key (Z85 or a key file), for every "
    "client, job manager, scheduler and web process",
    "EMQ_CURVE_PUBLIC_KEY": "optional: derived from the secret key (a mismatch is refused)",
    "EMQ_KEYS_RELOAD": "seconds between the broker's reloads of the authorized keys",
    "EMQ_BROKER_PYTHONMALLOC": "the broker re-executes itself once at start with this "
    "`PYTHONMALLOC` (glibc's malloc: the memory of a drained backlog goes back to the "
    "system; `pymalloc` or empty: Python's own allocator, no re-execution); a "
    "`PYTHONMALLOC` already set wins",
    # emq_django.results (results/conf.py)
    "EMQ_RESULTS_RETENTION": "seconds a job's history row is kept after it finished",
    "EMQ_RESULTS_PRUNE_INTERVAL": "seconds between automatic prunes, per recorder",
    "EMQ_RESULTS_SHOW_ARGS": "show arguments unmasked in the admin's job history",
    "EMQ_METRICS_TOKEN": "bearer token for `/emq/metrics` (empty: staff login only)",
    "EMQ_DASHBOARD_TIMEOUT": "seconds the dashboard waits for the monitor channel",
    "EMQ_RESULTS_MAX_BUFFER": "records a recorder keeps while the database is unreachable",
    # emq_django.scheduler (scheduler/config.py)
    "EMQ_SCHEDULER_CATCH_UP": "ticks missed while no scheduler ran: `once`, `none` or `all`",
    "EMQ_SCHEDULER_POLL": "seconds between the scheduler's database checks (how soon "
    "admin and ORM edits are seen)",
    "EMQ_SCHEDULER_GRACE": "seconds late before a tick counts as missed",
    # manage.py emq_analyze
    "EMQ_ANALYTICS_DIR": "where `emq_analyze` writes Parquet and its checkpoint",
}


def _shown(value: Any) -> str:
    if value in ("", (), {}):
        return "empty"
    return str(value)


def _core_defaults() -> dict[str, str]:
    from emq_django.conf import EmqSettings

    shown = {}
    for f in fields(EmqSettings):
        if f.default is not MISSING:
            shown[f"EMQ_{f.name}"] = _shown(f.default)
        else:
            assert f.default_factory is not MISSING
            shown[f"EMQ_{f.name}"] = _shown(f.default_factory())
    return shown


def _app_defaults() -> dict[str, str]:
    from emq_django.results.conf import DEFAULTS
    from emq_django.scheduler.config import SchedulerConfig

    shown = {name: _shown(value) for name, value in DEFAULTS.items()}
    scheduler = SchedulerConfig()
    shown["EMQ_SCHEDULER_CATCH_UP"] = scheduler.catch_up
    shown["EMQ_SCHEDULER_POLL"] = str(scheduler.poll_interval)
    shown["EMQ_SCHEDULER_GRACE"] = str(scheduler.grace)
    shown["EMQ_ANALYTICS_DIR"] = "var/analytics"
    return shown


def settings_reference() -> list[SettingDoc]:
    """Every setting, in the order the code declares them: (name, default, doc).

    A setting read by the code without a meaning here raises ``KeyError``, so the
    docs cannot miss one (tests/unit/test_docs.py builds the table)."""
    defaults = {**_core_defaults(), **_app_defaults(), **_SHOWN_DEFAULTS}
    return [SettingDoc(name, defaults[name], MEANINGS[name]) for name in defaults]
