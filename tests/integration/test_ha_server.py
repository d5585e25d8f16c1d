"""The server loop under a lease (``BrokerServer(ha=...)``), in this process, on a
PostgreSQL cluster of the tests' own: a commit fenced off by a newer epoch refuses
the turn's guaranteed jobs with the reason and makes the loop leave."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import zmq

from emq_django.broker.journal_pg import PgJournal
from emq_django.broker.lease import Lease
from emq_django.broker.lease_watch import ActiveWatch
from emq_django.broker.server import BrokerServer
from emq_django.client import Client
from emq_django.exceptions import JobRefused
from emq_django.protocol.headers import format_headers
from tests.support import wait_until
from tests.support.ports import private_broker_settings

TTL = 0.3
BODY = b'["run", {"path": "x", "callable": "y", "args": []}]'


def test_a_fenced_commit_refuses_the_job_with_the_reason_and_leaves_the_loop(
    pg_url: str, tmp_path: Path
) -> None:
    settings = replace(private_broker_settings(tmp_path), JOURNAL_PATH="")
    old, new = Lease(pg_url, "old", TTL), Lease(pg_url, "new", TTL)
    epoch = old.try_acquire()
    assert epoch == 1
    journal = PgJournal(pg_url, name="old")
    journal.fence(epoch, TTL)
    watch = ActiveWatch(old, "old", 3600.0, epoch)  # renewed by its commits alone
    context: zmq.Context[Any] = zmq.Context()
    server = BrokerServer(settings, context=context, journal=journal, ha=watch)
    outcome: list[Any] = []
    try:
        server.bind()
        assert server.status()["ha"]["role"] == "active"
        watch.tick(watch.clock())  # one renewal, then none: the loop is not run meanwhile
        watch.due = float("inf")
        assert wait_until(new.try_acquire, "the lease expired and taken", 5.0) == 2

        def send() -> None:
            client = Client(settings.FRONTEND_BIND, ack_timeout=5.0)
            try:
                client.send("q", format_headers(guarantee=True), BODY)
                outcome.append("acknowledged")
            except JobRefused as exc:
                outcome.append(exc)
            finally:
                client.close()

        sender = threading.Thread(target=send)
        sender.start()
        reason = server.run()  # reads the job, whose commit is fenced off
        sender.join(timeout=10)
    finally:
        server.close(linger=100)
        context.destroy(linger=0)
        old.close()
        new.close()
    assert reason is not None and "lease lost" in reason
    assert len(outcome) == 1 and isinstance(outcome[0], JobRefused), outcome
    assert "lease" in str(outcome[0]).lower()
