"""What ``emq_status``, ``/emq/metrics`` and the monitor's lines show of the lease
(``MONITOR JSON``'s ``ha`` section, issue 32): the role of the broker that answered,
the active one, the epoch, the standbys and the last failover with its duration."""

from __future__ import annotations

from typing import Any

from emq_django.broker.monitor import as_lines
from emq_django.management.commands.emq_status import Command
from emq_django.results.metrics import render

NOW = 1_800_000_000.0


def doc(ha: dict[str, Any] | None) -> dict[str, Any]:
    d: dict[str, Any] = {
        "broker": {"pid": 7, "host": "vm2", "uptime": 3.0, "time": NOW},
        "counters": {"succeeded": 1},
        "queues": [],
        "job_managers": [],
        "schedulers": [],
        "in_flight": 0,
    }
    if ha is not None:
        d["ha"] = ha
    return d


STANDBY = {
    "role": "standby",
    "name": "b2",
    "epoch": 4,
    "active": "b1",
    "expires_in": 0.8,
    "error": None,
    "last_failover": {"from": "b0", "to": "b1", "at": NOW - 30, "took_s": 0.142},
    "brokers": [
        {"name": "b1", "role": "active", "seen_ago": 0.1, "info": {"host": "vm1", "pid": 11}},
        {"name": "b2", "role": "standby", "seen_ago": 0.2, "info": {"host": "vm2", "pid": 7}},
    ],
}


def test_emq_status_tells_the_role_the_active_broker_and_the_last_failover() -> None:
    text = Command.render(doc(STANDBY))
    assert "this broker: b2 (standby); active: b1, epoch 4, lease expires in 0.80 s" in text
    assert "last failover: b0 -> b1, 30.0s ago, took 0.142 s" in text
    rows = [line.split() for line in text.splitlines()]
    assert ["b1", "active", "vm1", "11"] in [r[:4] for r in rows]
    assert ["b2", "standby", "vm2", "7"] in [r[:4] for r in rows]


def test_emq_status_without_a_lease_shows_no_ha_section() -> None:
    assert "High availability" not in Command.render(doc(None))


def test_metrics_give_the_role_epoch_brokers_and_failover() -> None:
    text = render({"ok": True, "monitor": doc(STANDBY)})
    assert 'emq_ha_active{broker="b2"} 0' in text
    assert "emq_ha_epoch 4" in text
    assert 'emq_ha_brokers{role="active"} 1' in text
    assert 'emq_ha_brokers{role="standby"} 1' in text
    assert "emq_ha_last_failover_seconds 0.142" in text
    assert f"emq_ha_last_failover_timestamp_seconds {NOW - 30}" in text
    assert "emq_ha_lease_expires_in_seconds 0.8" in text
    assert "emq_ha_" not in render({"ok": True, "monitor": doc(None)})


def test_monitor_lines_name_the_role() -> None:
    lines = as_lines(doc(STANDBY)).decode()
    assert "ha.role: standby\n" in lines and "ha.active: b1\n" in lines
    assert "ha.epoch: 4\n" in lines
