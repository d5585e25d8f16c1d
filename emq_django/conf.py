"""Typed settings, read when accessed.

Each ``EMQ_*`` value comes from the Django settings module if it defines it, else
from the environment (through django-environ), else from a default that runs on
one machine: loopback addresses and EventMQ's ports.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import environ
from django.core.exceptions import ImproperlyConfigured

_env = environ.Env()


@dataclass(frozen=True, slots=True)
class EmqSettings:
    BROKER_URL: str = "tcp://127.0.0.1:47291"  # client -> broker frontend
    WORKER_URL: str = "tcp://127.0.0.1:47290"  # job manager -> broker backend
    MONITOR_URL: str = "tcp://127.0.0.1:47293"  # admin/status -> monitor channel
    FRONTEND_BIND: str = "tcp://127.0.0.1:47291"
    BACKEND_BIND: str = "tcp://127.0.0.1:47290"
    MONITOR_BIND: str = "tcp://127.0.0.1:47293"
    MDP_BIND: str = "tcp://127.0.0.1:5555"  # Majordomo clients and workers; '' turns it off
    PZQ_RECEIVE_BIND: str = "tcp://127.0.0.1:11131"  # PZQ producers; '' turns PZQ off
    PZQ_SEND_BIND: str = "tcp://127.0.0.1:11132"  # PZQ consumers connect a ROUTER here
    PZQ_MONITOR_BIND: str = "tcp://127.0.0.1:11133"  # PZQ's MONITOR; '' leaves it out
    # plain text on a non-loopback bind, on purpose (broker/exposure.py); else CURVE
    ALLOW_PLAINTEXT: bool = False
    PZQ_QUEUE: str = "pzq"  # the emq queue PZQ messages live in
    PZQ_ACK_TIMEOUT: float = 5.0  # seconds a consumer has to ack a delivery
    PZQ_MAX_DELIVERIES: int = 10  # then the message goes to the dead letters
    PZQ_MAX_INFLIGHT: int = 1000  # deliveries not yet acked, over all consumers
    PZQ_MAX_AGE: float = 0.0  # seconds a message may wait; older ones expire (0: never)
    # the Event BUS port (snapshot ROUTER, publisher PUB, collector ROUTER); an empty
    # BUS_SNAPSHOT_BIND turns the port off
    BUS_SNAPSHOT_BIND: str = "tcp://127.0.0.1:5556"
    BUS_PUBLISH_BIND: str = "tcp://127.0.0.1:5557"
    BUS_COLLECT_BIND: str = "tcp://127.0.0.1:5558"
    BUS_PUBLISH_HWM: int = 10_000  # events queued per subscriber; then it misses some
    # emq's batch publisher (several events a message; emq.subscribe reads it); '': off
    BUS_BATCH_BIND: str = ""
    # seconds emq.publish waits for the broker's confirmation when it must (its
    # window is full, wait_published(), exit) before it raises PublishUnconfirmed
    BUS_CONFIRM_TIMEOUT: float = 30.0
    # emq.publish's default: confirmed batches (emq's broker) or the document's plain
    # PUB, never answered (a foreign Event BUS server such as event-bus-zeromq)
    BUS_CONFIRM: bool = True
    # where clients (emq.publish, emq.subscribe, emq_tail) connect; '': the bind address
    BUS_SNAPSHOT_URL: str = ""
    BUS_PUBLISH_URL: str = ""
    BUS_COLLECT_URL: str = ""
    BUS_BATCH_URL: str = ""
    # topic retention by prefix: {"/orders/": {"max_age": 86400, "max_count": 100000}}
    # (a dict or its JSON); "" is the catch-all (default 7 days, 100,000 events)
    TOPIC_RETENTION: dict[str, Any] = field(default_factory=dict)
    MC0_BIND: str = "tcp://127.0.0.1:61616"  # MCollective 0MQ connectors; '' turns it off
    HEARTBEAT_INTERVAL: float = 1.0
    HEARTBEAT_LIVENESS: int = 3
    ACK_TIMEOUT: float = 5.0
    ACK_WINDOW: int = 1000
    MONITOR_TIMEOUT: float = 2.0
    EAGER: bool = False
    IMPORTS: tuple[str, ...] = ()
    MAX_PENDING: int = 100_000
    DEFAULT_QUEUE: str = "default"
    PREFETCH: int = 64  # the most; each worker process adapts below it (worker/credit.py)
    SHUTDOWN_GRACE: float = 30.0
    RECORDER: str = ""  # dotted path of a JobRecorder class (worker/recording.py)
    RECORD_INTERVAL: float = 0.2  # a worker process passes its records on at least this often
    RECORD_BATCH: int = 2000  # ... or as soon as it holds this many
    RECORD_BUFFER: int = 50_000  # records a worker process keeps while the recorder lags
    # the recorder process's CPU priority: idle (only CPU time nothing else wants),
    # normal, or a nice value 1-19 (worker/recorder_process.py)
    RECORDER_PRIORITY: str = "idle"
    RECORDER_MAX_DELAY: float = 10.0  # the longest writing waits for a busy machine
    TRACE_DIR: str = ""  # where the broker writes its trace of job state changes
    # guaranteed jobs; '' turns the journal off; unset: default_journal_path()
    JOURNAL_PATH: str = "emq-journal.sqlite3"
    JOURNAL_SYNC: str = "normal"  # normal: survives a process crash; full: also power loss
    MAX_QUEUE_BYTES: int = 256 * 1024 * 1024  # bodies waiting in memory, per queue
    MAX_BODY_BYTES: int = 64 * 1024 * 1024  # one job's body; the broker refuses bigger ones
    RETRY_BASE: float = 1.0  # first retry after about this many seconds, then doubling
    RETRY_CAP: float = 300.0
    DEDUPE_WINDOW: float = 600.0  # seconds a finished job's id is remembered
    MAX_DEAD_LETTERS: int = 100_000
    KILL_GRACE: float = 3.0  # seconds between SIGTERM and SIGKILL for a cancelled running job
    # seconds past a job's time limit after which the broker ends the attempt itself
    # when nobody answered for it (an EventMQ job manager never does); keep it above
    # the job managers' EMQ_KILL_GRACE
    TIME_LIMIT_GRACE: float = 10.0
    # CURVE (emq_django/security): this process's secret key (Z85 or a key file); '':
    # plain text. The broker's public key, for clients. The public key is derived.
    CURVE_SECRET_KEY: str = ""
    CURVE_SERVER_KEY: str = ""
    CURVE_PUBLIC_KEY: str = ""
    KEYS_RELOAD: float = 5.0  # seconds between the broker's reloads of the allowed keys
    # the allocator the broker runs with (PYTHONMALLOC; '' or pymalloc: Python's own): it
    # re-executes itself with it at start, unless PYTHONMALLOC is set. glibc's malloc
    # gives a drained backlog's memory back; pymalloc keeps arenas a few objects pin
    # (broker/memory.py)
    BROKER_PYTHONMALLOC: str = "malloc"


def _coerce(name: str, kind: Any, value: Any) -> Any:
    try:
        if kind in ("bool", bool):
            if isinstance(value, str):
                return value.strip().lower() in ("1", "true", "yes", "on")
            return bool(value)
        if kind in ("int", int):
            return int(value)
        if kind in ("float", float):
            return float(value)
        if str(kind).startswith("dict"):
            value = json.loads(value) if isinstance(value, str) else value
            if not isinstance(value, dict):
                raise TypeError("expected a dict (or its JSON)")
            return value
        if str(kind).startswith("tuple"):
            if isinstance(value, str):
                return tuple(v.strip() for v in value.split(",") if v.strip())
            return tuple(value)
        return str(value)
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(f"EMQ_{name} has a bad value {value!r}: {exc}") from exc


def get_settings(**overrides: Any) -> EmqSettings:
    """Read the settings now; ``overrides`` win (used by commands' options)."""
    from django.conf import settings as django_settings

    values: dict[str, Any] = {}
    configured = django_settings.configured
    for f in fields(EmqSettings):
        key = f"EMQ_{f.name}"
        if f.name.lower() in overrides and overrides[f.name.lower()] is not None:
            raw = overrides[f.name.lower()]
        elif configured and hasattr(django_settings, key):
            raw = getattr(django_settings, key)
        elif key in os.environ:
            raw = _env.str(key)
        else:
            continue
        values[f.name] = _coerce(f.name, f.type, raw)
    if "JOURNAL_PATH" not in values:
        values["JOURNAL_PATH"] = default_journal_path()
    result = EmqSettings(**values)
    _validate(result)
    return result


def default_journal_path() -> str:
    """Where the broker's journal goes when EMQ_JOURNAL_PATH is not set, never the
    current directory (which is / under systemd):

    - ``$STATE_DIRECTORY/emq-journal.sqlite3`` under systemd with ``StateDirectory=``;
    - else ``BASE_DIR/var/emq-journal.sqlite3`` when the settings define ``BASE_DIR``
      (``startproject`` does: the directory of ``manage.py``);
    - else ``$XDG_STATE_HOME/emq-django/emq-journal.sqlite3`` (``~/.local/state``).
    """
    from django.conf import settings as django_settings

    name = "emq-journal.sqlite3"
    state_dir = os.environ.get("STATE_DIRECTORY", "").split(":")[0]
    if state_dir:
        return str(Path(state_dir) / name)
    base_dir = getattr(django_settings, "BASE_DIR", None) if django_settings.configured else None
    if base_dir:
        return str(Path(base_dir) / "var" / name)
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return str(Path(xdg) / "emq-django" / name)


def _validate(s: EmqSettings) -> None:
    if s.HEARTBEAT_INTERVAL <= 0 or s.HEARTBEAT_INTERVAL > 3:
        raise ImproperlyConfigured(
            "EMQ_HEARTBEAT_INTERVAL must be in (0, 3] seconds: EventMQ peers reconnect "
            "when a broker is silent for longer"
        )
    if s.HEARTBEAT_LIVENESS < 1:
        raise ImproperlyConfigured("EMQ_HEARTBEAT_LIVENESS must be >= 1 missed beats")
    if s.ACK_TIMEOUT <= 0:
        raise ImproperlyConfigured("EMQ_ACK_TIMEOUT must be > 0 seconds")
    if s.JOURNAL_SYNC not in ("normal", "full"):
        raise ImproperlyConfigured("EMQ_JOURNAL_SYNC must be 'normal' or 'full'")
    if s.RETRY_BASE < 0 or s.RETRY_CAP < s.RETRY_BASE:
        raise ImproperlyConfigured("EMQ_RETRY_BASE must be >= 0 and <= EMQ_RETRY_CAP")
    if s.TIME_LIMIT_GRACE <= 0:
        raise ImproperlyConfigured(
            "EMQ_TIME_LIMIT_GRACE must be > 0 seconds (and above EMQ_KILL_GRACE, which "
            "our job managers take to kill a job over its time limit)"
        )
    if s.MAX_BODY_BYTES < 1:
        raise ImproperlyConfigured("EMQ_MAX_BODY_BYTES must be >= 1")
    if s.PREFETCH < 1:
        raise ImproperlyConfigured("EMQ_PREFETCH must be >= 1")
    if s.RECORD_INTERVAL < 0 or s.RECORD_BATCH < 1 or s.RECORD_BUFFER < 1:
        raise ImproperlyConfigured(
            "EMQ_RECORD_INTERVAL must be >= 0, EMQ_RECORD_BATCH and EMQ_RECORD_BUFFER >= 1"
        )
    from emq_django.worker.recorder_process import parse_priority

    try:
        parse_priority(s.RECORDER_PRIORITY)
    except ValueError as exc:
        raise ImproperlyConfigured(f"EMQ_RECORDER_PRIORITY: {exc}") from None
    for name in (
        "BROKER_URL",
        "WORKER_URL",
        "MONITOR_URL",
        "FRONTEND_BIND",
        "BACKEND_BIND",
        "MONITOR_BIND",
    ):
        url = getattr(s, name)
        if "://" not in url:
            raise ImproperlyConfigured(
                f"EMQ_{name}={url!r} is not a ZeroMQ address such as tcp://127.0.0.1:47291"
            )
    if s.PZQ_ACK_TIMEOUT <= 0 or s.PZQ_MAX_DELIVERIES < 1 or s.PZQ_MAX_INFLIGHT < 1:
        raise ImproperlyConfigured(
            "EMQ_PZQ_ACK_TIMEOUT must be > 0 seconds, EMQ_PZQ_MAX_DELIVERIES and "
            "EMQ_PZQ_MAX_INFLIGHT >= 1"
        )
    if s.BROKER_PYTHONMALLOC not in ("", "malloc", "pymalloc"):
        raise ImproperlyConfigured(
            "EMQ_BROKER_PYTHONMALLOC must be 'malloc', 'pymalloc' or '' (Python's own, pymalloc)"
        )
    if s.KEYS_RELOAD <= 0:
        raise ImproperlyConfigured("EMQ_KEYS_RELOAD must be > 0 seconds")
    if s.CURVE_SECRET_KEY or s.CURVE_SERVER_KEY or s.CURVE_PUBLIC_KEY:
        from emq_django.security.keys import process_keys

        if not s.CURVE_SECRET_KEY:
            raise ImproperlyConfigured(
                "EMQ_CURVE_SERVER_KEY/EMQ_CURVE_PUBLIC_KEY are set but EMQ_CURVE_SECRET_KEY "
                "is not: CURVE needs this process's own secret key"
            )
        process_keys(s)  # a bad key or file is an error now, not at the first socket
    if s.PZQ_MAX_AGE < 0:
        raise ImproperlyConfigured("EMQ_PZQ_MAX_AGE must be >= 0 seconds (0: no limit)")
    if s.PZQ_RECEIVE_BIND and not s.PZQ_SEND_BIND:
        raise ImproperlyConfigured(
            "EMQ_PZQ_SEND_BIND is empty but EMQ_PZQ_RECEIVE_BIND is set: PZQ needs both "
            "(an empty EMQ_PZQ_RECEIVE_BIND turns PZQ off)"
        )
    from emq_django.broker.topics import parse_retention

    try:
        parse_retention(s.TOPIC_RETENTION)
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(f"EMQ_TOPIC_RETENTION: {exc}") from None
    if s.BUS_PUBLISH_HWM < 1:
        raise ImproperlyConfigured("EMQ_BUS_PUBLISH_HWM must be >= 1")
    if s.BUS_CONFIRM_TIMEOUT <= 0:
        raise ImproperlyConfigured("EMQ_BUS_CONFIRM_TIMEOUT must be > 0 seconds")
    if s.BUS_SNAPSHOT_BIND and not (s.BUS_PUBLISH_BIND and s.BUS_COLLECT_BIND):
        raise ImproperlyConfigured(
            "EMQ_BUS_PUBLISH_BIND and EMQ_BUS_COLLECT_BIND must be set when "
            "EMQ_BUS_SNAPSHOT_BIND is (an empty EMQ_BUS_SNAPSHOT_BIND turns the Event BUS off)"
        )
    for name in (
        "MDP_BIND",
        "PZQ_RECEIVE_BIND",
        "PZQ_SEND_BIND",
        "PZQ_MONITOR_BIND",
        "BUS_SNAPSHOT_BIND",
        "BUS_PUBLISH_BIND",
        "BUS_COLLECT_BIND",
        "BUS_BATCH_BIND",
        "MC0_BIND",
    ):
        # the protocol ports: '' turns one off
        url = getattr(s, name)
        if url and "://" not in url:
            raise ImproperlyConfigured(
                f"EMQ_{name}={url!r} is not a ZeroMQ address such as tcp://127.0.0.1:47291"
            )


_cached: EmqSettings | None = None


def cached_settings() -> EmqSettings:
    """``get_settings()``, read once per process and again after ``setting_changed``."""
    global _cached
    if _cached is None:
        _cached = get_settings()
    return _cached


def reset_cached_settings(**kwargs: Any) -> None:
    global _cached
    _cached = None


def _connect_signals() -> None:
    from django.core.signals import setting_changed

    setting_changed.connect(reset_cached_settings, dispatch_uid="emq_settings_reset")


_connect_signals()
