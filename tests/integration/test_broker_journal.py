"""The broker's journal of guaranteed jobs, end to end: a real BrokerServer in a
thread, real DEALER/REQ sockets on loopback TCP, a real SQLite file read from the
test. Breaking the journal is done for real, on its SQLite connection."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq

from emq_django.protocol import Ack, Error, Heartbeat, Reply, Request, decode
from tests.integration import test_broker_server as base
from tests.integration.test_broker_server import WAIT, Broker, P, recv_command, send_request
from tests.support import wait_until

start_broker = base.start_broker  # the fixture: a BrokerServer in a thread

FAIL = b"failed,ready,error:ValueError"


def rows(path: Path) -> dict[bytes, str]:
    """The jobs in the journal file as another process sees them: id -> state."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return dict(db.execute("SELECT id, state FROM jobs ORDER BY seq").fetchall())
    finally:
        db.close()


def answer(worker: zmq.Socket[Any], job: Request, status: bytes = b"ok,ready") -> None:
    worker.send_multipart([b"", P, b"REPLY", b"r-" + job.msgid, b'{"value": 1}', job.msgid, status])


def monitor_json(broker: Broker, request: bytes) -> dict[str, Any]:
    reply = broker.ask_monitor(request)
    try:
        doc: dict[str, Any] = json.loads(reply)
    except ValueError:
        raise AssertionError(f"{request!r} answered {reply[:200]!r}") from None
    return doc


def no_request_within(sock: zmq.Socket[Any], seconds: float) -> list[Any]:
    """Everything but heartbeats received in ``seconds``."""
    got = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if sock.poll(int(left * 1000) + 1):
            cmd = decode(sock.recv_multipart())
            if not isinstance(cmd, Heartbeat):
                got.append(cmd)
    return got


def break_journal(broker: Broker) -> sqlite3.Connection:
    """Swap the journal's connection for a closed one (a real, unusable SQLite
    connection); returns the good one, to put back with ``mend_journal``."""
    journal = broker.server.journal
    assert journal is not None
    good = journal.db
    broken = sqlite3.connect(journal.path, check_same_thread=False)
    broken.close()
    journal.db = broken
    return good


def mend_journal(broker: Broker, good: sqlite3.Connection) -> None:
    assert broker.server.journal is not None
    broker.server.journal.db = good


@pytest.fixture
def journal_path(tmp_path: Path) -> Path:
    return tmp_path / "jobs" / "journal.sqlite3"


# ---- written before the ACK ---------------------------------------------------------


def test_a_guaranteed_job_is_in_the_journal_file_before_its_ack(
    start_broker: Callable[..., Broker], journal_path: Path
) -> None:
    broker = start_broker(JOURNAL_PATH=str(journal_path))
    client = broker.client()
    for n in range(20):
        msgid = b"g-%d" % n
        send_request(client, msgid, headers=b"guarantee,reply-requested")
        assert recv_command(client, Ack).ack_msgid == msgid
        assert rows(journal_path).get(msgid) == "ready", f"{msgid!r} ACKed but not saved"
    send_request(client, b"plain")
    assert recv_command(client, Ack).ack_msgid == b"plain"
    assert b"plain" not in rows(journal_path)
    assert monitor_json(broker, b"MONITOR JSON")["journal"]["jobs"] == {"ready": 20}


def test_a_dispatched_guaranteed_job_is_saved_before_the_worker_gets_it(
    start_broker: Callable[..., Broker], journal_path: Path
) -> None:
    broker = start_broker(JOURNAL_PATH=str(journal_path))
    worker = broker.worker()
    worker.send_multipart([b"", P, b"READY", b"r"])
    client = broker.client()
    send_request(client, b"g-run", headers=b"guarantee,reply-requested")
    job = recv_command(worker, Request)
    assert job.msgid == b"g-run#1"
    assert rows(journal_path)[b"g-run"] == "ready"
    assert recv_command(client, Ack).ack_msgid == b"g-run"
    answer(worker, job)
    assert recv_command(client, Reply).request_msgid == b"g-run"
    wait_until(lambda: rows(journal_path)[b"g-run"] == "done", "the job to be done in the journal")


def test_a_job_the_journal_holds_goes_to_the_worker_while_the_next_commit_waits(
    start_broker: Callable[..., Broker], journal_path: Path
) -> None:
    """A worker that hands back a result gets its next job (saved in an earlier
    turn) without waiting for the commit of that result, which waits here on a
    real write lock held by another connection; the result's answer to the client
    still comes only after the commit."""
    broker = start_broker(JOURNAL_PATH=str(journal_path))
    worker = broker.worker()
    worker.send_multipart([b"", P, b"READY", b"r"])  # one credit
    client = broker.client()
    send_request(client, b"g-1", headers=b"guarantee,reply-requested")
    first = recv_command(worker, Request)
    assert recv_command(client, Ack).ack_msgid == b"g-1"
    send_request(client, b"g-2", headers=b"guarantee,reply-requested")
    assert recv_command(client, Ack).ack_msgid == b"g-2"  # saved, waiting for credit
    other = sqlite3.connect(journal_path, timeout=5, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # the journal's write lock: its next commit waits
    try:
        answer(worker, first)  # a result and the credit back: the done waits for the lock
        assert recv_command(worker, Request, timeout=3).msgid == b"g-2#1"
        assert no_request_within(client, 0.3) == []  # the answer waits for the commit
        assert rows(journal_path)[b"g-1"] == "ready"
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert recv_command(client, Reply).request_msgid == b"g-1"
    assert rows(journal_path)[b"g-1"] == "done"


# ---- restart ---------------------------------------------------------------------------


def test_waiting_guaranteed_jobs_survive_a_broker_restart(
    start_broker: Callable[..., Broker], journal_path: Path
) -> None:
    first = start_broker(JOURNAL_PATH=str(journal_path))
    client = first.client()
    for n in range(3):
        send_request(client, b"g-%d" % n, headers=b"guarantee")
        assert recv_command(client, Ack).ack_msgid == b"g-%d" % n
    send_request(client, b"plain")  # not guaranteed: lost with the broker
    assert recv_command(client, Ack).ack_msgid == b"plain"
    send_request(client, b"later", headers=b"guarantee,run-after:%.6f" % (time.time() + 0.5))
    assert recv_command(client, Ack).ack_msgid == b"later"
    first.server.request_shutdown()
    first.thread.join(WAIT)  # nothing in flight: it stops by itself
    assert not first.thread.is_alive()

    second = start_broker(JOURNAL_PATH=str(journal_path))
    doc = monitor_json(second, b"MONITOR JSON")
    (queue,) = doc["queues"]
    assert (queue["name"], queue["depth"]) == ("default", 3)
    assert doc["journal"]["jobs"] == {"ready": 3, "delayed": 1}

    worker = second.worker()
    for n in range(4):
        worker.send_multipart([b"", P, b"READY", b"r-%d" % n])
    got = [recv_command(worker, Request) for _ in range(3)]
    assert [j.msgid for j in got] == [b"g-0#1", b"g-1#1", b"g-2#1"]
    later = recv_command(worker, Request)  # once its run-after has come
    assert later.msgid == b"later#1"
    for job in [*got, later]:
        answer(worker, job)
    wait_until(
        lambda: set(rows(journal_path).values()) == {"done"}, "every restored job to be done"
    )
    # a client resending a finished job after the restart: ACKed, not run again
    client2 = second.client(b"client-2")
    send_request(client2, b"g-0", headers=b"guarantee")
    assert recv_command(client2, Ack).ack_msgid == b"g-0"
    assert no_request_within(worker, 0.3) == []
    assert monitor_json(second, b"MONITOR JSON")["counters"]["duplicates"] == 1


# ---- dead letters on the monitor channel --------------------------------------------


def test_deadletters_list_requeue_and_purge(
    start_broker: Callable[..., Broker], journal_path: Path
) -> None:
    broker = start_broker(JOURNAL_PATH=str(journal_path), RETRY_BASE=0.01, RETRY_CAP=0.02)
    worker = broker.worker()
    worker.send_multipart([b"", P, b"READY", b"r"])
    client = broker.client()
    headers = b"guarantee,reply-requested,retry-count:1,task:pkg.tasks.add"
    send_request(client, b"x1", headers=headers)
    assert recv_command(client, Ack).ack_msgid == b"x1"

    def fail_twice(first_attempt: int) -> None:
        for attempt in (first_attempt, first_attempt + 1):
            job = recv_command(worker, Request)
            assert job.msgid == b"x1#%d" % attempt
            answer(worker, job, FAIL)
        final = recv_command(client, Reply)
        assert final.request_msgid == b"x1" and final.failed

    fail_twice(1)
    listed = monitor_json(broker, b"DEADLETTERS LIST")
    assert listed["count"] == 1
    (letter,) = listed["dead_letters"]
    assert (letter["id"], letter["queue"], letter["task"]) == ("x1", "default", "pkg.tasks.add")
    assert (letter["attempts"], letter["error"], letter["guaranteed"]) == (2, "ValueError", True)
    assert monitor_json(broker, b"deadletters")["count"] == 1  # LIST is the default
    assert rows(journal_path)[b"x1"] == "dead"
    counters = monitor_json(broker, b"MONITOR JSON")["counters"]
    assert (counters["retried"], counters["failed"], counters["dead_lettered"]) == (1, 1, 1)

    assert "error" in monitor_json(broker, b"DEADLETTERS REQUEUE")  # names nothing
    assert monitor_json(broker, b"DEADLETTERS REQUEUE nope") == {"requeued": 0}
    assert monitor_json(broker, b"DEADLETTERS REQUEUE x1") == {"requeued": 1}
    assert monitor_json(broker, b"DEADLETTERS LIST")["count"] == 0
    fail_twice(3)  # its retries were reset: two more attempts
    assert monitor_json(broker, b"DEADLETTERS LIST")["count"] == 1

    assert monitor_json(broker, b"DEADLETTERS PURGE ALL") == {"purged": 1}
    assert monitor_json(broker, b"DEADLETTERS LIST") == {"dead_letters": [], "count": 0}
    wait_until(lambda: rows(journal_path)[b"x1"] == "done", "the purged job to be done")
    assert broker.ask_monitor(b"DEADLETTERS FROB x1").startswith(b"ERROR")
    # purged means forgotten, but for its id: a resend is a duplicate
    send_request(client, b"x1", headers=headers)
    assert recv_command(client, Ack).ack_msgid == b"x1"
    assert no_request_within(worker, 0.3) == []


# ---- a journal that cannot be written ------------------------------------------------


def test_a_failed_journal_commit_turns_the_ack_into_a_journal_error(
    start_broker: Callable[..., Broker], journal_path: Path
) -> None:
    broker = start_broker(JOURNAL_PATH=str(journal_path))
    client = broker.client()
    send_request(client, b"before", headers=b"guarantee")
    assert recv_command(client, Ack).ack_msgid == b"before"
    good = break_journal(broker)
    try:
        for n in range(2):
            send_request(client, b"unsaved-%d" % n, headers=b"guarantee")
            err = recv_command(client, Error)
            assert (err.ref_msgid, err.code) == (b"unsaved-%d" % n, "journal-error")
            assert "not saved" in err.reason
        # the broker keeps running: a job that is not guaranteed is still taken
        send_request(client, b"plain")
        assert recv_command(client, Ack).ack_msgid == b"plain"
    finally:
        mend_journal(broker, good)
    assert b"unsaved-0" not in rows(journal_path)
    assert broker.server.journal is not None and broker.server.journal.errors >= 2
    send_request(client, b"after", headers=b"guarantee")
    assert recv_command(client, Ack).ack_msgid == b"after"
    assert rows(journal_path)[b"after"] == "ready"
    assert broker.thread.is_alive()


def test_a_job_refused_for_the_journal_is_not_run(
    start_broker: Callable[..., Broker], journal_path: Path
) -> None:
    """The client was told the job was not taken (ERROR journal-error); the broker
    must not run it anyway."""
    broker = start_broker(JOURNAL_PATH=str(journal_path))
    worker = broker.worker()
    worker.send_multipart([b"", P, b"READY", b"r"])
    client = broker.client()
    good = break_journal(broker)
    try:
        send_request(client, b"unsaved", headers=b"guarantee")
        assert recv_command(client, Error).code == "journal-error"
        got = no_request_within(worker, 0.5)
    finally:
        mend_journal(broker, good)
    assert [c.msgid for c in got if isinstance(c, Request)] == []


def test_a_job_resent_after_a_journal_error_is_saved_before_its_ack(
    start_broker: Callable[..., Broker], journal_path: Path
) -> None:
    """A client that got ERROR journal-error sends the job again once the disk is
    fine: the ACK it gets then must mean the job is in the journal."""
    broker = start_broker(JOURNAL_PATH=str(journal_path))
    client = broker.client()
    good = break_journal(broker)
    try:
        send_request(client, b"again", headers=b"guarantee")
        assert recv_command(client, Error).code == "journal-error"
    finally:
        mend_journal(broker, good)
    send_request(client, b"again", headers=b"guarantee")
    assert recv_command(client, Ack).ack_msgid == b"again"
    assert rows(journal_path).get(b"again") == "ready", "ACKed as guaranteed, but not saved"


def test_the_monitor_answers_while_the_journal_is_broken(
    start_broker: Callable[..., Broker], journal_path: Path
) -> None:
    broker = start_broker(JOURNAL_PATH=str(journal_path))
    good = break_journal(broker)
    try:
        doc = monitor_json(broker, b"MONITOR JSON")
        assert "counters" in doc
        assert b"messages: " in broker.ask_monitor(b"MONITOR")
    finally:
        mend_journal(broker, good)


def test_a_broken_journal_while_refilling_spilled_jobs_does_not_stop_the_broker(
    start_broker: Callable[..., Broker], journal_path: Path
) -> None:
    broker = start_broker(JOURNAL_PATH=str(journal_path), MAX_PENDING=2)
    client = broker.client()
    for msgid in (b"p-0", b"p-1"):
        send_request(client, msgid)
        assert recv_command(client, Ack).ack_msgid == msgid
    send_request(client, b"spilled", headers=b"guarantee")
    assert recv_command(client, Ack).ack_msgid == b"spilled"
    assert rows(journal_path)[b"spilled"] == "spilled"
    assert monitor_json(broker, b"MONITOR JSON")["counters"]["spilled"] == 1
    good = break_journal(broker)
    try:
        worker = broker.worker()
        for n in range(2):  # the queue drains: the broker reads the spilled job back
            worker.send_multipart([b"", P, b"READY", b"r-%d" % n])
        time.sleep(0.3)
        assert broker.thread.is_alive(), "the broker thread died"
        got = [recv_command(worker, Request).msgid for _ in range(2)]
        assert got == [b"p-0#1", b"p-1#1"]
        send_request(client, b"still-there")
        assert recv_command(client, Ack).ack_msgid == b"still-there"
    finally:
        mend_journal(broker, good)


def spill_two(broker: Broker, journal_path: Path) -> zmq.Socket[Any]:
    """MAX_PENDING=2: two guaranteed jobs wait in memory, two more on disk only."""
    client = broker.client()
    for msgid in (b"p-0", b"p-1", b"s-0", b"s-1"):
        send_request(client, msgid, headers=b"guarantee")
        assert recv_command(client, Ack).ack_msgid == msgid
    assert rows(journal_path) == {
        b"p-0": "ready",
        b"p-1": "ready",
        b"s-0": "spilled",
        b"s-1": "spilled",
    }
    send_request(client, b"refused")
    err = recv_command(client, Error)
    assert (err.ref_msgid, err.code) == (b"refused", "queue-full")
    assert monitor_json(broker, b"MONITOR JSON")["counters"]["spilled"] == 2
    return client


def test_spilled_jobs_are_read_back_and_run(
    start_broker: Callable[..., Broker], journal_path: Path
) -> None:
    broker = start_broker(JOURNAL_PATH=str(journal_path), MAX_PENDING=2)
    spill_two(broker, journal_path)
    worker = broker.worker()
    got = []
    for n in range(4):  # one slot: a READY after each job
        worker.send_multipart([b"", P, b"READY", b"r-%d" % n])
        got.append(recv_command(worker, Request).msgid)
    assert got == [b"p-0#1", b"p-1#1", b"s-0#1", b"s-1#1"]
    assert set(rows(journal_path).values()) == {"ready"}


def test_spilled_jobs_are_all_read_back_for_a_job_manager_with_several_slots(
    start_broker: Callable[..., Broker], journal_path: Path
) -> None:
    """A job manager gives several READYs at once (prefetch, several processes). The
    broker reads back max(MAX_PENDING // 4, 1) spilled jobs at a time; those go
    straight to the free slots, and the rest must still be read back."""
    broker = start_broker(JOURNAL_PATH=str(journal_path), MAX_PENDING=2)
    client = spill_two(broker, journal_path)
    worker = broker.worker()
    # hold the broker for a moment (a writer holds the SQLite lock; its commit waits)
    # so that the job manager's four READYs arrive together, as they do under load
    locker = sqlite3.connect(journal_path)
    try:
        locker.execute("BEGIN IMMEDIATE")
        send_request(client, b"s-2", headers=b"guarantee")
        time.sleep(0.2)
        for n in range(5):
            worker.send_multipart([b"", P, b"READY", b"r-%d" % n])
        time.sleep(0.3)
    finally:
        locker.rollback()
        locker.close()
    assert recv_command(client, Ack).ack_msgid == b"s-2"
    got = [c.msgid for c in no_request_within(worker, 1.0) if isinstance(c, Request)]
    left = broker.server.core.queues["default"].spilled
    assert sorted(got) == [b"p-0#1", b"p-1#1", b"s-0#1", b"s-1#1", b"s-2#1"], (
        f"{left} spilled jobs never read back"
    )


def test_a_spilled_backlog_is_read_back_in_batches_in_order(
    start_broker: Callable[..., Broker], journal_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker reads spilled jobs back a batch at a time (``REFILL_BATCH``, so
    that no loop turn holds it for long), reading on while the queue wants more:
    every job of a backlog many batches long runs once, oldest first."""
    from emq_django.broker import server as server_module

    monkeypatch.setattr(server_module, "REFILL_BATCH", 3)
    broker = start_broker(JOURNAL_PATH=str(journal_path), MAX_PENDING=40)
    client = broker.client()
    sent = [b"j-%02d" % n for n in range(60)]
    for msgid in sent:
        send_request(client, msgid, headers=b"guarantee")
        assert recv_command(client, Ack).ack_msgid == msgid
    assert monitor_json(broker, b"MONITOR JSON")["counters"]["spilled"] == 20
    worker = broker.worker()
    got = []
    for n in range(len(sent)):  # one slot: a READY after each job
        worker.send_multipart([b"", P, b"READY", b"r-%d" % n])
        job = recv_command(worker, Request)
        got.append(job.msgid)
        answer(worker, job, b"ok")
    assert got == [m + b"#1" for m in sent]
    assert not [c for c in no_request_within(worker, 0.5) if isinstance(c, Request)]
    wait_until(lambda: set(rows(journal_path).values()) == {"done"}, "every job done")
    assert broker.server.core.queues["default"].spilled == 0
