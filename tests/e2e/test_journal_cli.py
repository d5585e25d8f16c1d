"""The broker command and its journal file: refusing a file that is not a journal,
--new-journal, and an exit log that says where the waiting jobs went."""

from __future__ import annotations

import signal
from pathlib import Path

from emq_django.client import Client
from emq_django.protocol.headers import format_headers
from tests.support import EmqProcesses, free_tcp_ports, start_broker

# every address a broker binds (a second broker on other ports than the first's)
BINDS = [
    "EMQ_FRONTEND_BIND",
    "EMQ_BACKEND_BIND",
    "EMQ_MONITOR_BIND",
    "EMQ_MDP_BIND",
    "EMQ_PZQ_RECEIVE_BIND",
    "EMQ_PZQ_SEND_BIND",
    "EMQ_PZQ_MONITOR_BIND",
    "EMQ_MC0_BIND",
    "EMQ_BUS_SNAPSHOT_BIND",
    "EMQ_BUS_PUBLISH_BIND",
    "EMQ_BUS_COLLECT_BIND",
]


def test_an_empty_journal_file_stops_the_broker_with_a_clear_error(
    emq_processes: EmqProcesses, emq_env: dict[str, str]
) -> None:
    journal = Path(emq_env["EMQ_JOURNAL_PATH"])
    journal.write_bytes(b"")
    broker = emq_processes.start("emq_broker")
    assert emq_processes.wait_for_exit(broker, timeout=30) != 0
    assert "empty file, not a journal" in broker.stderr()
    assert "--new-journal" in broker.stderr()
    assert journal.exists() and journal.stat().st_size == 0  # left as it was


def test_a_file_that_is_not_a_journal_stops_the_broker(
    emq_processes: EmqProcesses, emq_env: dict[str, str]
) -> None:
    journal = Path(emq_env["EMQ_JOURNAL_PATH"])
    journal.write_bytes(b"these are not the jobs you are looking for\n" * 10)
    broker = emq_processes.start("emq_broker")
    assert emq_processes.wait_for_exit(broker, timeout=30) != 0
    assert "not an SQLite file" in broker.stderr()


def test_new_journal_moves_the_old_file_aside_and_starts_empty(
    emq_processes: EmqProcesses, emq_env: dict[str, str]
) -> None:
    journal = Path(emq_env["EMQ_JOURNAL_PATH"])
    journal.write_bytes(b"")
    broker = emq_processes.start("emq_broker", "--new-journal")
    emq_processes.wait_for_output(broker, "broker up", timeout=30)
    aside = list(journal.parent.glob(journal.name + ".old-*"))
    assert len(aside) == 1 and aside[0].stat().st_size == 0
    assert journal.exists() and journal.read_bytes()[:16] == b"SQLite format 3\x00"


def test_the_exit_log_tells_guaranteed_jobs_kept_from_others_dropped(
    emq_processes: EmqProcesses, emq_env: dict[str, str]
) -> None:
    broker = emq_processes.start("emq_broker")
    emq_processes.wait_for_output(broker, "broker up", timeout=30)
    client = Client(emq_env["EMQ_BROKER_URL"], ack_timeout=10)
    try:
        body = b'["run", {"path": "x", "callable": "y", "args": [], "kwargs": {}}]'
        for _ in range(3):
            client.send("nobody-serves", format_headers(guarantee=True), body)
        for _ in range(2):
            client.send("nobody-serves", format_headers(), body)
        client.flush(timeout=10)
    finally:
        client.close()
    emq_processes.send_signal(broker, signal.SIGTERM)
    assert emq_processes.wait_for_exit(broker, timeout=30) == 0
    log = broker.stderr()
    assert "0 jobs in flight, 5 waiting; 3 guaranteed kept in the journal" in log
    assert "2 not guaranteed dropped" in log


def test_a_second_broker_on_a_running_brokers_journal_file_is_refused(
    emq_processes: EmqProcesses, emq_env: dict[str, str]
) -> None:
    """Two brokers on one SQLite journal would each restore and run the other's
    guaranteed jobs: the second is refused at start, told who holds the file and
    that standbys need the PostgreSQL journal. The lock dies with its holder, so a
    broker started on the file after a kill -9 is not refused."""
    first = start_broker(emq_processes, emq_env)
    ports = free_tcp_ports(11)
    other = {key: f"tcp://127.0.0.1:{port}" for key, port in zip(BINDS, ports, strict=True)}
    second = emq_processes.start("emq_broker", env=other, name="second")
    assert emq_processes.wait_for_exit(second, timeout=30) != 0
    err = second.stderr()
    assert f"in use by another broker (pid {first.pid}" in err
    assert "EMQ_JOURNAL_URL" in err and "broker up" not in err
    assert first.alive()

    emq_processes.send_signal(first, signal.SIGKILL)
    emq_processes.wait_for_exit(first)
    third = emq_processes.start("emq_broker", env=other, name="third")
    emq_processes.wait_for_output(third, "broker up", timeout=30)
