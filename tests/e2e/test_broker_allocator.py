"""The broker command re-executes itself under glibc's malloc (EMQ_BROKER_PYTHONMALLOC,
broker/memory.py), keeping its PID, unless told not to or PYTHONMALLOC is set."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from emq_django.broker.memory import trim_heap
from emq_django.monitor_client import status
from tests.support import EmqProcesses

pytestmark = [
    pytest.mark.skipif(not trim_heap(), reason="no glibc malloc_trim: the broker keeps pymalloc"),
    pytest.mark.skipif("PYTHONMALLOC" in os.environ, reason="PYTHONMALLOC is set for the tests"),
]


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def started(
    emq_processes: EmqProcesses, emq_env: dict[str, str], env: dict[str, str]
) -> tuple[int, dict[str, Any]]:
    broker = emq_processes.start("emq_broker", env=env)
    emq_processes.wait_for_output(broker, "broker up", timeout=30)
    assert f"(pid {broker.pid})" in broker.stderr()  # the process we started, re-executed
    doc = status(emq_env["EMQ_MONITOR_URL"], timeout=10.0)
    return broker.pid, doc["memory"]


def test_the_broker_runs_under_glibc_malloc_by_default_with_the_same_pid(
    emq_processes: EmqProcesses, emq_env: dict[str, str]
) -> None:
    pid, memory = started(emq_processes, emq_env, {})
    assert environ_of(pid).get("PYTHONMALLOC") == "malloc"
    assert memory["allocator"] == "malloc"


def test_an_empty_setting_keeps_pymalloc(
    emq_processes: EmqProcesses, emq_env: dict[str, str]
) -> None:
    pid, memory = started(emq_processes, emq_env, {"EMQ_BROKER_PYTHONMALLOC": ""})
    assert "PYTHONMALLOC" not in environ_of(pid)
    assert memory["allocator"] == "pymalloc"


def test_a_pythonmalloc_set_by_whoever_started_it_wins(
    emq_processes: EmqProcesses, emq_env: dict[str, str]
) -> None:
    pid, memory = started(emq_processes, emq_env, {"PYTHONMALLOC": "pymalloc"})
    assert environ_of(pid)["PYTHONMALLOC"] == "pymalloc"
    assert memory["allocator"] == "pymalloc"
