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

from emq_django import wire
from emq_django.exceptions import BrokerUnavailable, ProtocolError
from emq_django.protocol import frames as F
from emq_django.protocol.body import encode_run_body
from emq_django.protocol.frames import PROTOCOL, decode
from emq_django.protocol.headers import format_headers
from emq_django.scheduler import store
from emq_django.scheduler.config import SchedulerConfig
from emq_django.scheduler.inbound import schedule_spec, unschedule_name
from emq_django.scheduler.keys import split_task_name
from emq_django.scheduler.models import SOURCE_WIRE, ScheduledJob, ScheduleRun

log = logging.getLogger(__name__)

MIN_WAKE = 0.02  # seconds: do not spin while another scheduler holds a due row
DB_RETRY = 2.0  # seconds between attempts while the database is unavailable


class SchedulerPeer:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.name = f"{pysocket.gethostname()}:{os.getpid()}"
        self.context: zmq.Context[Any] | None = None
        self.sock: zmq.Socket[Any] | None = None
        self.inbox: list[F.Schedule] = []  # SCHEDULE/UNSCHEDULE seen while sending
        self.stopping = False
        self.fired = 0  # jobs sent
        self._n = 0
        self._prefix = b"s" + os.urandom(5).hex().encode()
        self._connections = 0
        self.last_recv = self.last_beat = 0.0
        self.next_db = 0.0

    def _id(self) -> bytes:
        # the broker uses a REQUEST's msgid as the job's id: unique across schedulers
        self._n += 1
        return b"%s%08x" % (self._prefix, self._n)

    # ---- lifecycle ----------------------------------------------------------

    def run(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self.context = zmq.Context()
        self._connect()
        log.info(
            "scheduler %s: broker %s, catch-up policy %r",
            self.name,
            self.config.broker_url,
            self.config.catch_up,
        )
        try:
            self._loop()
        finally:
            self._goodbye()
            self.context.term()
            log.info("scheduler %s stopped after sending %d jobs", self.name, self.fired)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stopping = True

    def _loop(self) -> None:
        c = self.config
        silence_limit = c.heartbeat_interval * c.heartbeat_liveness
        while not self.stopping:
            assert self.sock is not None
            now = time.monotonic()
            wait = max(0.0, min(self.next_db, self.last_beat + c.heartbeat_interval) - now)
            if self.sock.poll(int(wait * 1000) + 1):
                self._drain()
            self._handle_inbox()
            now = time.monotonic()
            if now - self.last_recv > silence_limit:
                log.warning(
                    "broker at %s silent for %.1f s; connecting again",
                    c.broker_url,
                    now - self.last_recv,
                )
                self._connect()
            elif now - self.last_beat >= c.heartbeat_interval:
                # the broker counts only HEARTBEATs from a scheduler, not its REQUESTs
                self._send([b"", PROTOCOL, F.HEARTBEAT, self._id(), b"%f" % time.time()])
                self.last_beat = now
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
        msgid = self._id()
        try:
            self._send([b"", PROTOCOL, F.REQUEST, msgid, job.queue.encode(), headers, body])
            self._wait_ack(msgid)
        except (zmq.Again, BrokerUnavailable) as exc:
            # a fresh socket: the unacknowledged REQUEST must not reach the broker
            # later, when the tick has been rolled back to be fired again
            self._connect()
            if isinstance(exc, BrokerUnavailable):
                raise
            raise BrokerUnavailable(
                f"cannot send to the broker at {self.config.broker_url}"
            ) from None
        self.fired += 1
        # in _fire_one's transaction: rolled back with the tick if a later send fails
        ScheduleRun.note(job.pk, msgid.decode())
        log.info("sent %s for schedule %s (due %s)", job.task, job.name, due.isoformat())

    def _wait_ack(self, msgid: bytes) -> None:
        assert self.sock is not None
        deadline = time.monotonic() + self.config.ack_timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.sock.poll(int(remaining * 1000) + 1):
                raise BrokerUnavailable(
                    f"the broker at {self.config.broker_url} did not acknowledge within "
                    f"{self.config.ack_timeout:g} s"
                )
            for cmd in self._read():
                if type(cmd) is F.Ack and cmd.ack_msgid == msgid:
                    return
                if type(cmd) is F.Error and cmd.ref_msgid == msgid:
                    log.warning("the broker refused a scheduled job: %s", cmd.reason)
                    return

    # ---- broker messages ------------------------------------------------------

    def _drain(self) -> None:
        for cmd in self._read():
            if type(cmd) is F.Kbye and not self.stopping:
                log.info("the broker said goodbye; connecting again")
                self._connect()
                return

    def _read(self) -> list[F.Command]:
        """Everything waiting on the socket; SCHEDULE/UNSCHEDULE go to the inbox."""
        assert self.sock is not None
        commands: list[F.Command] = []
        while wire.readable(self.sock):
            frames = wire.recv(self.sock)
            self.last_recv = time.monotonic()
            try:
                cmd = decode(frames)
            except ProtocolError as exc:
                log.warning("dropped a malformed message from the broker: %s", exc)
                continue
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

    def _connect(self) -> None:
        assert self.context is not None
        if self.sock is not None:
            self.sock.close(linger=0)
        self._connections += 1
        sock = self.context.socket(zmq.DEALER)
        sock.linger = 0
        # EventMQ's router needs a UTF-8 identity; a fresh one per connection
        sock.identity = f"scheduler-{self.name}-{self._connections}".encode()
        sock.connect(self.config.broker_url)
        self.sock = sock
        meta = {"role": "scheduler", "host": pysocket.gethostname(), "pid": os.getpid()}
        # queued on the pipe that connect() made, even before the broker answers
        self._send(F.Inform(self._id(), (), F.PEER_SCHEDULER, meta).encode())
        self.last_recv = self.last_beat = time.monotonic()

    def _send(self, frames: list[bytes]) -> None:
        assert self.sock is not None
        wire.send(self.sock, frames)

    def _goodbye(self) -> None:
        if self.sock is None:
            return
        try:
            self._send([b"", PROTOCOL, F.KBYE, self._id()])
        except zmq.ZMQError:
            pass
        self.sock.close(linger=200)
        self.sock = None
