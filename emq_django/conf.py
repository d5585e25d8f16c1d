"""Settings, read through one reader and validated in one place.

Every ``EMQ_*`` setting is declared once, in ``settings_registry.EmqSettings`` (name,
type, default, meaning, section, check); rules that tie several settings together
are in ``_validate`` here. Each value comes from the Django settings module if it
defines it, else from the environment (through django-environ), else from its
default, which runs on one machine: loopback addresses and EventMQ's ports.

``get_settings()`` reads them all (the broker, job managers, commands);
``read(name)`` reads one (the optional apps: results, scheduler, analytics).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import MISSING, Field, fields
from pathlib import Path
from typing import Any

import environ
from django.core.exceptions import ImproperlyConfigured

from emq_django.protocol.events import parse_retention
from emq_django.protocol.flow import parse_queue_rates
from emq_django.settings_registry import SECTIONS, EmqSettings

__all__ = ["SECTIONS", "EmqSettings", "get_settings", "read", "cached_settings"]

_env = environ.Env()


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


_FIELDS: dict[str, Field[Any]] = {f.name: f for f in fields(EmqSettings)}


def setting_fields(section: str | None = None) -> list[Field[Any]]:
    """The declared settings (of one section), in the order they are declared."""
    return [f for f in _FIELDS.values() if section is None or f.metadata["section"] == section]


def default_of(f: Field[Any]) -> Any:
    if f.default is not MISSING:
        return f.default
    assert f.default_factory is not MISSING
    return f.default_factory()


def _read(f: Field[Any], override: Any = None) -> tuple[bool, Any]:
    """(whether it was set, its value): the override, else Django's settings, else the
    environment; a set value is coerced to the field's type and checked."""
    from django.conf import settings as django_settings

    key = f"EMQ_{f.name}"
    if override is not None:
        raw = override
    elif django_settings.configured and hasattr(django_settings, key):
        raw = getattr(django_settings, key)
    elif key in os.environ:
        raw = _env.str(key)
    else:
        return False, default_of(f)
    value = _coerce(f.name, f.type, raw)
    check = f.metadata["check"]
    problem = check(value) if check is not None else None
    if problem:
        raise ImproperlyConfigured(f"{key}={value!r}: {problem}")
    return True, value


def read(name: str) -> Any:
    """One setting's value now (``name`` without ``EMQ_``); raises ``ImproperlyConfigured``
    for a bad value."""
    return _read(_FIELDS[name])[1]


def get_settings(**overrides: Any) -> EmqSettings:
    """Read the settings now; ``overrides`` win (used by commands' options).
    Raises ``ImproperlyConfigured`` for a bad value."""
    values: dict[str, Any] = {}
    for f in _FIELDS.values():
        found, value = _read(f, overrides.get(f.name.lower()))
        if found:
            values[f.name] = value
    if "JOURNAL_PATH" not in values:
        values["JOURNAL_PATH"] = default_journal_path()
    result = EmqSettings(**values)
    _validate(result)
    for validate in _validators:
        validate(result)
    return result


# Checks of the settings that need a higher layer (CURVE keys read from their files):
# registered by the apps' ready() (apps.py), so that this module imports nothing above.
_validators: list[Callable[[EmqSettings], object]] = []


def add_validator(validate: Callable[[EmqSettings], object]) -> None:
    """Run ``validate(settings)`` in every ``get_settings()``; it raises
    ``ImproperlyConfigured``."""
    if validate not in _validators:
        _validators.append(validate)


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


def _validate_ha(s: EmqSettings) -> None:
    """The PostgreSQL journal and the lease: a renewal slower than the lease lasts
    would hand the lease to a standby while the active broker is well."""
    if s.JOURNAL_URL and not s.JOURNAL_URL.startswith(("postgresql://", "postgres://")):
        raise ImproperlyConfigured(
            "EMQ_JOURNAL_URL must be a PostgreSQL URL (postgresql://user@host:port/db)"
        )
    if s.LEASE_RENEW >= s.LEASE_TTL or s.LEASE_POLL >= s.LEASE_TTL:
        raise ImproperlyConfigured(
            "EMQ_LEASE_RENEW and EMQ_LEASE_POLL must be below EMQ_LEASE_TTL "
            f"(renew {s.LEASE_RENEW:g} s, poll {s.LEASE_POLL:g} s, ttl {s.LEASE_TTL:g} s)"
        )


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
    _validate_ha(s)
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
    for name in ("BROKER_URL", "WORKER_URL", "MONITOR_URL"):
        # one broker, or a comma-separated list of brokers (failover: transport.addresses)
        url = getattr(s, name)
        for address in url.split(",") if "," in url else (url,):
            if "://" not in address:
                raise ImproperlyConfigured(
                    f"EMQ_{name}={url!r}: {address.strip()!r} is not a ZeroMQ address such as "
                    "tcp://127.0.0.1:47291 (several brokers: a comma-separated list)"
                )
    for name in ("FRONTEND_BIND", "BACKEND_BIND", "MONITOR_BIND"):
        url = getattr(s, name)
        if "://" not in url or "," in url:
            raise ImproperlyConfigured(
                f"EMQ_{name}={url!r} is not one ZeroMQ address such as tcp://127.0.0.1:47291 "
                "(a broker binds one; its peers' EMQ_*_URL may list several brokers)"
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
        if not s.CURVE_SECRET_KEY:
            raise ImproperlyConfigured(
                "EMQ_CURVE_SERVER_KEY/EMQ_CURVE_PUBLIC_KEY are set but EMQ_CURVE_SECRET_KEY "
                "is not: CURVE needs this process's own secret key"
            )
    if s.PZQ_MAX_AGE < 0:
        raise ImproperlyConfigured("EMQ_PZQ_MAX_AGE must be >= 0 seconds (0: no limit)")
    if s.PZQ_RECEIVE_BIND and not s.PZQ_SEND_BIND:
        raise ImproperlyConfigured(
            "EMQ_PZQ_SEND_BIND is empty but EMQ_PZQ_RECEIVE_BIND is set: PZQ needs both "
            "(an empty EMQ_PZQ_RECEIVE_BIND turns PZQ off)"
        )
    try:
        parse_queue_rates(s.RATE_LIMITS)
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(f"EMQ_RATE_LIMITS: {exc}") from None
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
