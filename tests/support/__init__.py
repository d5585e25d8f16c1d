"""Helpers shared by the test suites: free ports, processes, waits, a core harness.

Test files import them from here (``from tests.support import wait_until``); the
conftest.py files only wire them into fixtures.
"""

from tests.support.ports import (
    free_tcp_port,
    free_tcp_ports,
    port_accepts,
    port_of,
    private_broker_settings,
)
from tests.support.processes import (
    REPO_ROOT,
    STOP_GRACE,
    EmqProcesses,
    ManagedProcess,
    live_processes,
    start_broker,
)
from tests.support.waiting import wait_until

__all__ = [
    "REPO_ROOT",
    "STOP_GRACE",
    "EmqProcesses",
    "ManagedProcess",
    "free_tcp_port",
    "free_tcp_ports",
    "live_processes",
    "port_accepts",
    "port_of",
    "private_broker_settings",
    "start_broker",
    "wait_until",
]
