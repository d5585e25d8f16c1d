"""``SchedulerPeer``: the scheduler's connection to the broker and its loop.

One DEALER on the broker's client port. It INFORMs as a ``scheduler``, beats
its heart, stores the SCHEDULE and UNSCHEDULE commands the broker forwards, and
sends a REQUEST (with the ``task:`` header, without ``reply-requested``) for
every due tick, waiting for the broker's ACK before the tick counts as fired.
It wakes for the earliest next run and at least every ``poll_interval``, which
is how schedules changed in the admin or the ORM are seen without a restart.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import signal
import socket as pysocket
import time
from typing import Any

import zmq
from django.db import DatabaseError, close_old_connections
from django.utils import timezone

from emq_django.exceptions import BrokerUnavailable, HandshakeRefused, ProtocolError
from emq_django.link import REFUSED_EXIT, BrokerLink
from emq_django.logconfig import job_fields
from emq_django.protocol import frames as F
from emq_django.protocol.body import encode_run_body
from emq_django.protocol.headers import Headers, format_headers
from emq_django.scheduler import store
from emq_django.scheduler.config import SchedulerConfig
from emq_django.scheduler.inbound import schedule_spec, unschedule_name
from emq_django.scheduler.keys import split_task_name, tick_id
from emq_django.scheduler.models import SOURCE_WIRE, ScheduledJob, ScheduleRun

log = logging.getLogger(__name__)

MIN_WAKE = 0.02  # seconds: do not spin while another scheduler holds a due row
DB_RETRY = 2.0  # seconds between attempts while the database is unavailable


class SchedulerPeer:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.name = f"{pysocket.gethostname()}:{os.getpid()}"
        self.context: zmq.Context[Any] | None = None
        self.link: BrokerLink | None = None
        self.inbox: list[F.Schedule] = []  # SCHEDULE/UNSCHEDULE seen while sending
        self.stopping = False
        self.fired = 0  # jobs sent
        self.next_db = 0.0

    # ---- lifecycle ----------------------------------------------------------

    def run(self) -> int:
        """Serve until a signal (returns 0) or until the broker refuses this
        scheduler's handshake (logs why and returns ``link.REFUSED_EXIT``)."""
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self.context = zmq.Context()
        c = self.config
        meta = {"role": "scheduler", "host": pysocket.gethostname(), "pid": os.getpid()}
        self.link = BrokerLink(
            self.context,
            c.broker_url,
            (),
            F.PEER_SCHEDULER,
            meta,
            heartbeat_interval=c.heartbeat_interval,
            heartbeat_liveness=c.heartbeat_liveness,
            identity=self._identity,
        )
        log.info("scheduler %s: broker %s, catch-up policy %r", self.name, c.broker_url, c.catch_up)
        try:
            # connect() too: a refusal may come before its INFORM could be queued
            self.link.connect()
            self._loop()
            return 0
        except HandshakeRefused as exc:
            log.error(
                "scheduler %s: %s. Stopping (exit code %d): register this process's key "
                "with the scheduler role (manage.py emq_keys), or correct "
                "EMQ_CURVE_SECRET_KEY / EMQ_CURVE_SERVER_KEY",
                self.name,
                exc,
                REFUSED_EXIT,
            )
            return REFUSED_EXIT
        finally:
            self._goodbye()
            self.context.term()
            log.info("scheduler %s stopped after sending %d jobs", self.name, self.fired)

    def _identity(self) -> bytes:
        # EventMQ's router needs a UTF-8 identity; a fresh one per connection
        assert self.link is not None
        return f"scheduler-{self.name}-{self.link.connections}".encode()

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def _loop(self) -> None:
        link = self.link
        assert link is not None
        while not self.stopping:
            now = time.monotonic()
            wait = max(0.0, min(self.next_db, link.last_send + link.interval) - now)
            if link.poll(wait):
                self._drain()
            self._handle_inbox()
            link.tick()  # a HEARTBEAT when due; a fresh connection after silence
            if time.monotonic() >= self.next_db and not self.stopping:
                self.next_db = time.monotonic() + self._database_turn()

    # ---- the database turn --------------------------------------------------

    def _database_turn(self) -> float:
        """Plan changed schedules, fire due ticks; returns seconds until the next turn."""
        c = self.config
        try:
            close_old_connections()
            now = timezone.now()
            store.reconcile(now)
            for fired in store.fire_due(now, self._send_job, c.catch_up, c.grace_delta):
                if fired.runs:
                    log.debug(
                        "fired %s (due %s) x%d", fired.name, fired.due.isoformat(), fired.runs
                    )
            soonest = store.soonest()
        except DatabaseError as exc:
            log.warning("database unavailable (%s); trying again in %.0f s", exc, DB_RETRY)
            close_old_connections()
            return DB_RETRY
        if soonest is None:
            return c.poll_interval
        until = (soonest - timezone.now()).total_seconds()
        return min(max(until, MIN_WAKE), c.poll_interval)

    def _send_job(self, job: ScheduledJob, due: dt.datetime) -> None:
        """Send one REQUEST for ``job`` and wait for the broker's ACK; raises
        ``BrokerUnavailable`` when it does not come in time."""
        path, callable_name = split_task_name(job.task)
        body = encode_run_body(path, callable_name, job.args or [], job.kwargs or {})
        headers = format_headers(
            guarantee=job.guarantee, retry_count=job.retries, timeout=job.timeout, task=job.task
        )
        link = self.link
        assert link is not None
        # the broker uses a REQUEST's msgid as the job's id and de-duplicates it: one
        # id per tick, so that a resend (the first one was taken but its ACK lost, or
        # it waited in a socket until the broker came up) is the same job
        msgid = tick_id(job.name, due)
        try:
            frames = F.Request(msgid, job.queue, Headers(raw=headers), body).encode()
            link.send(frames, nonblocking=True)
            self._wait_ack(msgid, frames)
        except (zmq.Again, BrokerUnavailable) as exc:
            # a fresh socket: the unacknowledged REQUEST must not reach the broker
            # later, when the tick has been rolled back to be fired again
            link.connect()
            if isinstance(exc, BrokerUnavailable):
                raise
            raise BrokerUnavailable(
                f"cannot send to the broker at {self.config.broker_url}"
            ) from None
        self.fired += 1
        # in _fire_one's transaction: rolled back with the tick if a later send fails
        ScheduleRun.note(job.pk, msgid.decode(), due=due)
        log.info(
            "sent %s for schedule %s (due %s)",
            job.task,
            job.name,
            due.isoformat(),
            extra=job_fields(msgid, task=job.task),
        )

    def _wait_ack(self, msgid: bytes, frames: list[bytes]) -> None:
        """Wait for the ACK of the tick ``msgid``. With a failover list, a link that
        connected again meanwhile (another broker: ``BrokerLink.moved``) sends the
        tick again at once, under its id (a broker that has it de-duplicates)."""
        assert self.link is not None
        deadline = time.monotonic() + self.config.ack_timeout
        connections = self.link.connections
        while (remaining := deadline - time.monotonic()) > 0:
            if self.link.connections != connections and self.link.informed:
                connections = self.link.connections
                self.link.send(frames, nonblocking=True)
                deadline = max(deadline, time.monotonic() + self.config.ack_timeout)
            # poll() may return early with nothing to read (a handshake event): the
            # wait is over at the deadline only
            if not self.link.poll(remaining):
                continue
            for cmd in self._read():
                if type(cmd) is F.Ack and cmd.ack_msgid == msgid:
                    return
                if type(cmd) is F.Error and cmd.ref_msgid == msgid:
                    log.warning("the broker refused a scheduled job: %s", cmd.reason)
                    return
        raise BrokerUnavailable(
            f"the broker at {self.config.broker_url} did not acknowledge within "
            f"{self.config.ack_timeout:g} s"
        )

    # ---- broker messages ------------------------------------------------------

    def _drain(self) -> None:
        for cmd in self._read():
            if type(cmd) is F.Kbye and not self.stopping:
                log.info("the broker said goodbye; connecting again")
                assert self.link is not None
                self.link.connect()
                return

    def _read(self) -> list[F.Command]:
        """Everything waiting now, decoded; SCHEDULE/UNSCHEDULE go to the inbox."""
        assert self.link is not None
        commands: list[F.Command] = []
        for cmd in self.link.messages():
            if isinstance(cmd, F.Schedule):
                self.inbox.append(cmd)
            else:
                commands.append(cmd)
        return commands

    def _handle_inbox(self) -> None:
        while self.inbox:
            cmd = self.inbox[0]
            try:
                if type(cmd) is F.Unschedule:
                    self._unschedule(cmd)
                else:
                    self._schedule(cmd)
            except ProtocolError as exc:
                log.warning("dropped a %s: %s", cmd.command.decode(), exc)
            except DatabaseError as exc:
                log.warning("database unavailable (%s); will store the schedule later", exc)
                close_old_connections()
                return
            self.inbox.pop(0)

    def _schedule(self, cmd: F.Schedule) -> None:
        spec = schedule_spec(cmd, timezone.get_default_timezone_name())
        store.upsert(
            name=spec.name,
            task=spec.task,
            timing=spec.timing,
            args=spec.args,
            kwargs=spec.kwargs,
            queue=spec.queue,
            retries=spec.retries,
            timeout=spec.timeout,
            guarantee=spec.guarantee,
            nohaste=spec.nohaste,
            max_runs=spec.max_runs,
            source=SOURCE_WIRE,
        )
        self.next_db = 0.0  # a schedule that runs at once should not wait for the poll
        log.info(
            "stored schedule %s: %s %s on queue %s%s",
            spec.name,
            spec.task,
            spec.timing.describe(),
            spec.queue,
            " (nohaste)" if spec.nohaste else "",
        )

    def _unschedule(self, cmd: F.Schedule) -> None:
        name = unschedule_name(cmd)
        removed = store.remove(name)
        log.info("unscheduled %s%s", name, "" if removed else " (it was not scheduled)")

    # ---- socket -----------------------------------------------------------------

    def _goodbye(self) -> None:
        if self.link is None or self.link.sock is None:
            return
        try:
            self.link.send(F.Kbye(self.link.new_id()).encode(), nonblocking=True)
        except zmq.ZMQError:
            pass
        self.link.close(linger=200)
