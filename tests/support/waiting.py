"""Waiting on observable state instead of sleeping a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from tests.support.processes import EmqProcesses, ManagedProcess


def wait_until(
    ready: Callable[[], Any],
    what: str,
    timeout: float = 15.0,
    procs: EmqProcesses | Iterable[ManagedProcess] = (),
    interval: float = 0.05,
) -> Any:
    """Poll ``ready`` until it returns something truthy, and return that.

    Raises AssertionError after ``timeout`` s, or as soon as one of ``procs`` (an
    EmqProcesses' processes, or a list of them) has exited.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = ready()
        if value:
            return value
        watched = procs.processes if isinstance(procs, EmqProcesses) else procs
        for p in watched:
            assert p.alive(), f"{p.name} exited with {p.popen.returncode} waiting for {what}"
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
