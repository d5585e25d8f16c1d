"""The settings registry: every ``EMQ_*`` setting, declared once.

Each field of ``EmqSettings`` is one setting: its name (``EMQ_`` + the field's name),
its type (the annotation), its default, its meaning (the docs' settings table is
generated from it: ``settings_reference.py``), its section and, where a single value
can be wrong on its own, its check. ``emq_django.conf`` reads and validates them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SECTIONS = (
    "client",
    "broker",
    "ports",
    "topics",
    "worker",
    "security",
    "results",
    "scheduler",
    "analytics",
    "ha",  # high availability: the PostgreSQL journal, active and standby brokers
)
# a check takes the value and returns what is wrong with it, or None
Check = Callable[[Any], "str | None"]


def setting(
    default: Any,
    doc: str,
    *,
    section: str,
    check: Check | None = None,
    shown: str | None = None,
    factory: Callable[[], Any] | None = None,
) -> Any:
    """One setting's declaration: a dataclass field carrying its doc, section and check.
    ``shown`` is the default as the docs show it, when the code computes it."""
    assert section in SECTIONS, section
    meta = {"doc": doc, "section": section, "check": check, "shown": shown}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _positive(value: float) -> str | None:
    return None if value > 0 else f"must be > 0, got {value:g}"


def _scheduler_poll(value: float) -> str | None:
    return None if 0 < value <= 2 else "must be in (0, 2] seconds"


def _not_negative(value: float) -> str | None:
    return None if value >= 0 else "must be >= 0 seconds"


# scheduler/timing.py's CATCH_UP_POLICIES (tests/unit/test_settings_registry.py)
CATCH_UP_POLICIES = ("once", "none", "all")


def _catch_up(value: str) -> str | None:
    return None if value in CATCH_UP_POLICIES else f"use one of {', '.join(CATCH_UP_POLICIES)}"


def parse_priority(text: str) -> int | None:
    """``EMQ_RECORDER_PRIORITY`` -> a nice value (0 for "normal"), or None for "idle"."""
    value = text.strip().lower()
    if value == "idle":
        return None
    if value == "normal":
        return 0
    if value.isdigit() and 1 <= int(value) <= 19:
        return int(value)
    raise ValueError(f"give idle, normal or a nice value from 1 to 19, not {text!r}")


def _log_format(value: str) -> str | None:
    return None if value in ("text", "json") else "use text or json"


def _trace_url(value: str) -> str | None:
    return None if not value or "{trace_id}" in value else "must contain {trace_id}"


def _priority(value: str) -> str | None:
    try:
        parse_priority(value)
    except ValueError as exc:
        return str(exc)
    return None


@dataclass(frozen=True, slots=True)
class EmqSettings:
    BROKER_URL: str = setting(
        "tcp://127.0.0.1:47291",
        "client -> broker frontend; several brokers (active and standbys): a comma-separated "
        "list, and the client fails over to the one that serves",
        section="client",
    )
    WORKER_URL: str = setting(
        "tcp://127.0.0.1:47290",
        "job manager -> broker backend (a comma-separated list: failover, as EMQ_BROKER_URL)",
        section="client",
    )
    MONITOR_URL: str = setting(
        "tcp://127.0.0.1:47293",
        "where the admin, `emq_status` and the monitor client reach the monitor channel (a "
        "comma-separated list: the active broker's answers)",
        section="client",
    )
    FRONTEND_BIND: str = setting(
        "tcp://127.0.0.1:47291", "where the broker listens for clients", section="broker"
    )
    BACKEND_BIND: str = setting(
        "tcp://127.0.0.1:47290", "where the broker listens for job managers", section="broker"
    )
    MONITOR_BIND: str = setting("tcp://127.0.0.1:47293", "monitor channel", section="broker")
    MDP_BIND: str = setting(
        "tcp://127.0.0.1:5555",
        "Majordomo clients and workers (`''` turns the port off)",
        section="ports",
    )
    PZQ_RECEIVE_BIND: str = setting(
        "tcp://127.0.0.1:11131", "PZQ producers (`''` turns PZQ off)", section="ports"
    )
    PZQ_SEND_BIND: str = setting(
        "tcp://127.0.0.1:11132", "PZQ consumers connect a ROUTER here", section="ports"
    )
    PZQ_MONITOR_BIND: str = setting(
        "tcp://127.0.0.1:11133", "PZQ `MONITOR` (`''` leaves it out)", section="ports"
    )
    ALLOW_PLAINTEXT: bool = setting(
        False,
        "let the broker bind a non-loopback address without CURVE ([Safe "
        "defaults](../features/security.md#safe-defaults))",
        section="security",
    )
    PZQ_QUEUE: str = setting("pzq", "the emq queue PZQ messages live in", section="ports")
    PZQ_ACK_TIMEOUT: float = setting(
        5.0, "seconds a consumer has to ack a delivery", section="ports"
    )
    PZQ_MAX_DELIVERIES: int = setting(
        10, "deliveries before a message is a dead letter", section="ports"
    )
    PZQ_MAX_INFLIGHT: int = setting(
        1000, "deliveries not yet acked, over all consumers", section="ports"
    )
    PZQ_MAX_AGE: float = setting(
        0.0, "seconds a message may wait before it expires (0: never)", section="ports"
    )
    BUS_SNAPSHOT_BIND: str = setting(
        "tcp://127.0.0.1:5556",
        "Event BUS snapshot (`''` turns the Event BUS off)",
        section="topics",
    )
    BUS_PUBLISH_BIND: str = setting(
        "tcp://127.0.0.1:5557", "Event BUS publisher (subscribers' SUB)", section="topics"
    )
    BUS_COLLECT_BIND: str = setting(
        "tcp://127.0.0.1:5558", "Event BUS collector (producers' PUB)", section="topics"
    )
    BUS_PUBLISH_HWM: int = setting(
        10_000, "events queued per subscriber before it misses some", section="topics"
    )
    BUS_BATCH_BIND: str = setting(
        "",
        "emq's batch publisher: several events a message in a burst; `emq.subscribe` reads it "
        "when set (`''`: off)",
        section="topics",
    )
    BUS_CONFIRM_TIMEOUT: float = setting(
        30.0,
        "seconds `emq.publish` waits for the broker's confirmation (window full, "
        "`wait_published`, exit) before `PublishUnconfirmed`",
        section="topics",
    )
    BUS_CONFIRM: bool = setting(
        True,
        "`emq.publish`'s default: confirmed batches towards emq's broker; `false` (or "
        "`publish(..., confirm=False)`) sends the Event BUS document's plain PUB, never answered,"
        " for a foreign Event BUS server such as event-bus-zeromq "
        "([Topics](../protocols/topics.md#what-emqs-own-path-promises))",
        section="topics",
    )
    BUS_SNAPSHOT_URL: str = setting(
        "",
        "where `emq.subscribe` asks for snapshots (`''`: the bind address; a "
        "comma-separated list: failover between brokers)",
        section="topics",
    )
    BUS_PUBLISH_URL: str = setting(
        "",
        "where `emq.subscribe` takes live events (`''`: the bind address; a "
        "comma-separated list: failover between brokers)",
        section="topics",
    )
    BUS_COLLECT_URL: str = setting(
        "",
        "where `emq.publish` sends (`''`: the bind address; a "
        "comma-separated list: failover between brokers)",
        section="topics",
    )
    BUS_BATCH_URL: str = setting(
        "", "where `emq.subscribe` reads batches (`''`: the bind address)", section="topics"
    )
    TOPIC_RETENTION: dict[str, Any] = setting(
        None,
        "events kept, by topic prefix (dict or JSON)",
        section="topics",
        factory=dict,
        shown='{"": {"max_age": 604800, "max_count": 100000}}',
    )
    MC0_BIND: str = setting(
        "tcp://127.0.0.1:61616", "mc0 connectors (`''` turns the port off)", section="ports"
    )
    HEARTBEAT_INTERVAL: float = setting(1.0, "seconds between heartbeats", section="broker")
    HEARTBEAT_LIVENESS: int = setting(3, "missed beats before a peer is dead", section="broker")
    ACK_TIMEOUT: float = setting(
        5.0, "seconds a client waits for the broker's ACK", section="client"
    )
    ACK_WINDOW: int = setting(
        1000,
        "unacknowledged jobs a client may have in flight (a guaranteed `map()`'s sliding window)",
        section="client",
    )
    MONITOR_TIMEOUT: float = setting(
        2.0, "seconds `emq_status` waits for the monitor", section="client"
    )
    EAGER: bool = setting(False, "run tasks inline in `.delay()` (tests)", section="client")
    IMPORTS: tuple[str, ...] = setting(
        (),
        "extra task modules to import (a list, or comma-separated)",
        section="client",
        shown="empty",
    )
    MAX_PENDING: int = setting(
        100_000, "jobs waiting per queue before the broker refuses more", section="broker"
    )
    DEFAULT_QUEUE: str = setting(
        "default", "the queue of a task declared without `queue=`", section="client"
    )
    PREFETCH: int = setting(
        64, "most jobs one worker process holds (it adapts below this)", section="worker"
    )
    SHUTDOWN_GRACE: float = setting(
        30.0, "seconds a stopping broker waits for in-flight jobs", section="broker"
    )
    RECORDER: str = setting(
        "", "the class that records finished jobs (results and history)", section="worker"
    )
    RECORD_INTERVAL: float = setting(
        0.2,
        "seconds between a worker process's hand-overs of records to the recorder process",
        section="worker",
    )
    RECORD_BATCH: int = setting(2000, "... or as soon as it holds this many", section="worker")
    RECORD_BUFFER: int = setting(
        50_000,
        "records a worker process keeps while its recorder process is behind or down",
        section="worker",
    )
    RECORDER_PRIORITY: str = setting(
        "idle",
        "the recorder process's CPU priority: `idle` (`SCHED_IDLE`), `normal`, or a nice value "
        "1-19",
        section="worker",
        check=_priority,
    )
    RECORDER_MAX_DELAY: float = setting(
        10.0,
        "the longest the recorder process holds records back while the CPUs are busy",
        section="worker",
    )
    LOG_FORMAT: str = setting(
        "text",
        "how `emq_broker`, `emq_jobmanager` and `emq_scheduler` write their logs: `text` "
        "lines as LOGGING formats them, or `json`, one object a line with the job's "
        "`job_id`, `attempt`, `task` and `queue` ([observability](../features/observability.md))",
        section="broker",
        check=_log_format,
    )
    TRACE_URL: str = setting(
        "",
        "a link from the admin's job page to the job's OpenTelemetry trace: a URL with "
        "`{trace_id}` (e.g. `https://tempo.example.com/trace/{trace_id}`); `''`: no link "
        "([observability](../features/observability.md))",
        section="results",
        check=_trace_url,
    )
    OTEL_BROKER_SPANS: bool = setting(
        False,
        "the broker adds an OpenTelemetry span per attempt it dispatches, `dispatch <queue>`, "
        "the child of the job's `traceparent`, when a tracer provider is set in the broker "
        "process; off: no span and no work per job "
        "([observability](../features/observability.md#opentelemetry))",
        section="broker",
        shown="false",
    )
    TRACE_DIR: str = setting(
        "",
        "where the broker writes its trace ([trace format](../trace-format.md))",
        section="broker",
    )
    JOURNAL_PATH: str = setting(
        "emq-journal.sqlite3",
        "the broker's journal of guaranteed jobs (`''` turns it off); under systemd with "
        "`StateDirectory=`, `$STATE_DIRECTORY/emq-journal.sqlite3`; without `BASE_DIR` in the "
        "settings, `~/.local/state/emq-django/`",
        section="broker",
        shown="BASE_DIR/var/emq-journal.sqlite3",
    )
    JOURNAL_SYNC: str = setting(
        "normal", "`normal` survives a process crash, `full` also a power loss", section="broker"
    )
    # high availability (broker/journal_pg.py, broker/lease.py)
    JOURNAL_URL: str = setting(
        "",
        "`postgresql://user@host:port/db`: the journal in PostgreSQL, in place of "
        "`EMQ_JOURNAL_PATH`; brokers sharing it run active/standby",
        section="ha",
    )
    LEASE_TTL: float = setting(
        1.0,
        "seconds the active broker's lease lasts without renewal (PostgreSQL's clock)",
        section="ha",
        check=_positive,
    )
    LEASE_RENEW: float = setting(
        0.2,
        "seconds between the active broker's lease renewals (each journal commit renews too)",
        section="ha",
        check=_positive,
    )
    LEASE_POLL: float = setting(
        0.1,
        "seconds between a standby's attempts to take an expired lease",
        section="ha",
        check=_positive,
    )
    BROKER_NAME: str = setting(
        "",
        "this broker's name in the lease and the monitor",
        section="ha",
        shown="hostname-pid",
    )
    MAX_QUEUE_BYTES: int = setting(
        256 * 1024 * 1024, "job bodies waiting in memory per queue", section="broker"
    )
    MAX_BODY_BYTES: int = setting(
        64 * 1024 * 1024,
        "one job's body; the broker refuses bigger ones (`body-too-big`)",
        section="broker",
    )
    RETRY_BASE: float = setting(1.0, "first retry delay (doubling, +-20% jitter)", section="broker")
    RETRY_CAP: float = setting(300.0, "the longest retry delay", section="broker")
    DEDUPE_WINDOW: float = setting(
        600.0, "seconds a finished job's id is remembered", section="broker"
    )
    MAX_DEAD_LETTERS: int = setting(
        100_000, "dead letters kept (the oldest go first)", section="broker"
    )
    KILL_GRACE: float = setting(
        3.0,
        "seconds between SIGTERM and SIGKILL for a cancelled running job (a time limit kills at "
        "once)",
        section="worker",
    )
    TASK_METRICS: bool = setting(
        False,
        "count jobs succeeded, failed, retried and dead-lettered per task and queue, with "
        "run-time histograms, for `/emq/metrics` "
        "([Live lists and controls](../features/admin-live.md))",
        section="broker",
        shown="false",
    )
    TIME_LIMIT_GRACE: float = setting(
        10.0,
        "seconds past a job's `timeout` after which the broker ends an unanswered attempt itself "
        "(keep it above `EMQ_KILL_GRACE`; [Guarantees](../features/guarantees.md))",
        section="broker",
    )
    PRIORITY_AGING: float = setting(
        1.0,
        "seconds of waiting that raise a job's priority by one, so that no job waits for ever "
        "behind higher ones; 0: strict priority ([Priority](../features/priority.md))",
        section="broker",
        check=_not_negative,
    )
    RATE_LIMITS: dict[str, str] = setting(
        None,
        'rate limits by queue, global over every job manager: `{"email": "10/s"}` '
        "(dict or JSON; `/s`, `/m`, `/h`), a token bucket with a burst of 1 at the broker "
        "([Flow control](../features/flow-control.md))",
        section="broker",
        factory=dict,
        shown="{}",
    )
    CURVE_SECRET_KEY: str = setting(
        "",
        "this process's CURVE secret key (Z85, or a key file's path); empty: plain text "
        "([Security](../features/security.md))",
        section="security",
    )
    CURVE_SERVER_KEY: str = setting(
        "",
        "the broker's CURVE public key (Z85 or a key file), for every client, job manager, "
        "scheduler and web process",
        section="security",
    )
    CURVE_PUBLIC_KEY: str = setting(
        "", "optional: derived from the secret key (a mismatch is refused)", section="security"
    )
    KEYS_RELOAD: float = setting(
        5.0, "seconds between the broker's reloads of the authorized keys", section="security"
    )
    BROKER_PYTHONMALLOC: str = setting(
        "malloc",
        "the broker re-executes itself once at start with this `PYTHONMALLOC` (glibc's malloc: "
        "the memory of a drained backlog goes back to the system; `pymalloc` or empty: Python's "
        "own allocator, no re-execution); a `PYTHONMALLOC` already set wins",
        section="broker",
    )

    # emq_django.results
    RESULTS_RETENTION: float = setting(
        604800.0,
        "seconds a job's history row is kept after it finished",
        section="results",
        check=_positive,
        shown="604800",
    )
    RESULTS_PRUNE_INTERVAL: float = setting(
        60.0,
        "seconds between automatic prunes, per recorder",
        section="results",
        check=_positive,
        shown="60",
    )
    RESULTS_SHOW_ARGS: bool = setting(
        False,
        "show arguments unmasked in the admin's job history",
        section="results",
        shown="false",
    )
    METRICS_TOKEN: str = setting(
        "", "bearer token for `/emq/metrics` (empty: staff login only)", section="results"
    )
    DASHBOARD_TIMEOUT: float = setting(
        0.75,
        "seconds the dashboard waits for the monitor channel",
        section="results",
        check=_positive,
    )
    RESULTS_MAX_BUFFER: int = setting(
        50000,
        "records a recorder keeps while the database is unreachable",
        section="results",
        check=_positive,
    )
    # emq_django.scheduler
    SCHEDULER_CATCH_UP: str = setting(
        "once",
        "ticks missed while no scheduler ran: `once`, `none` or `all`",
        section="scheduler",
        check=_catch_up,
    )
    SCHEDULER_POLL: float = setting(
        0.5,
        "seconds between the scheduler's database checks (how soon admin and ORM edits are seen)",
        section="scheduler",
        check=_scheduler_poll,
    )
    SCHEDULER_GRACE: float = setting(
        1.0,
        "seconds late before a tick counts as missed",
        section="scheduler",
        check=_not_negative,
    )
    # manage.py emq_analyze
    ANALYTICS_DIR: str = setting(
        "",
        "where `emq_analyze` writes Parquet and its checkpoint",
        section="analytics",
        shown="var/analytics",
    )
