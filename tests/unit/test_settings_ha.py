"""The high-availability settings (section "ha"): their defaults, and the rules that
tie them together."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from emq_django.conf import get_settings


def test_the_ha_defaults_give_the_failover_budget() -> None:
    s = get_settings()
    assert (s.JOURNAL_URL, s.BROKER_NAME) == ("", "")
    assert (s.LEASE_TTL, s.LEASE_RENEW, s.LEASE_POLL) == (1.0, 0.2, 0.1)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"EMQ_JOURNAL_URL": "mysql://x/y"}, "must be a PostgreSQL URL"),
        ({"EMQ_LEASE_RENEW": "1.0"}, "must be below EMQ_LEASE_TTL"),
        ({"EMQ_LEASE_TTL": "0.1"}, "must be below EMQ_LEASE_TTL"),
        ({"EMQ_LEASE_TTL": "0"}, "EMQ_LEASE_TTL"),
    ],
)
def test_bad_ha_settings_are_refused(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ImproperlyConfigured, match=message):
        get_settings()


def test_a_postgresql_url_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMQ_JOURNAL_URL", "postgresql://emq@db:5432/emq")
    monkeypatch.setenv("EMQ_BROKER_NAME", "broker-1")
    s = get_settings()
    assert (s.JOURNAL_URL, s.BROKER_NAME) == ("postgresql://emq@db:5432/emq", "broker-1")
