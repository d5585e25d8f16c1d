"""The broker's server loop: the only part of the broker that touches sockets.

One thread, three ROUTER sockets (frontend, backend, monitor) and a wake-up
pipe for signals. It drains each ready socket until it would block, hands the
frames to ``BrokerCore`` and sends what the core queued, never blocking. It
blocks in poll until the next timer is due: an idle broker uses no CPU.
"""

from __future__ import annotations

import logging
import os
import signal
import socket as pysocket
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import zmq

from emq_django import transport, wire
from emq_django.broker import monitor
from emq_django.broker.core import BACKEND, FRONTEND, BrokerConfig, BrokerCore
from emq_django.broker.journal import Journal, JournalError
from emq_django.broker.trace import TraceWriter
from emq_django.conf import EmqSettings
from emq_django.protocol import frames as F
from emq_django.protocol.limits import REFUSED_JOURNAL
from emq_django.transport import SocketOptions

log = logging.getLogger(__name__)

CHUNK = 256  # messages from one socket before turning to the other
FRONTEND_HWM = 100_000  # ACKs and REPLYs waiting for a slow client
# Trace lines are buffered and written at most every TRACE_WRITE_INTERVAL (when
# the broker has handled a batch of messages, or wakes up for them), or as soon
# as TRACE_MAX_EVENTS wait. Writing at the end of every loop turn instead (a
# system call every few jobs under load) took 5% of the broker's time while it
# drained no-op jobs (py-spy).
TRACE_MAX_EVENTS = 4096
TRACE_WRITE_INTERVAL = 0.02  # seconds


class BrokerServer:
    def __init__(
        self,
        settings: EmqSettings,
        context: zmq.Context[Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        shutdown_grace: float | None = None,
        new_journal: bool = False,
    ) -> None:
        self.settings = settings
        self.context = context or zmq.Context.instance()
        self.clock = clock
        self.grace = settings.SHUTDOWN_GRACE if shutdown_grace is None else shutdown_grace
        self.core = BrokerCore(
            BrokerConfig(
                heartbeat_interval=settings.HEARTBEAT_INTERVAL,
                heartbeat_liveness=settings.HEARTBEAT_LIVENESS,
                max_pending=settings.MAX_PENDING,
                max_queue_bytes=settings.MAX_QUEUE_BYTES,
                retry_base=settings.RETRY_BASE,
                retry_cap=settings.RETRY_CAP,
                dedupe_window=settings.DEDUPE_WINDOW,
                max_dead_letters=settings.MAX_DEAD_LETTERS,
                max_body_bytes=settings.MAX_BODY_BYTES,
            ),
            clock(),
        )
        self.core.wall_offset = time.time() - clock()
        self.journal: Journal | None = None
        if settings.JOURNAL_PATH:
            self.journal = Journal(settings.JOURNAL_PATH, settings.JOURNAL_SYNC, new=new_journal)
            self.core.journal_ops = []
            counts = self.core.restore(self.journal.load(), clock())
            waiting = sum(n for state, n in counts.items() if state != "done")
            log.info(
                "journal %s: %d guaranteed jobs reloaded %s",
                settings.JOURNAL_PATH,
                waiting,
                {k: v for k, v in counts.items() if k != "done"},
            )
        self.tracer: TraceWriter | None = None
        self._trace_due = 0.0  # clock: from when waiting trace lines are written
        if settings.TRACE_DIR:
            self.tracer = TraceWriter(settings.TRACE_DIR)
            self.core.trace = []
        self.info = {
            "host": pysocket.gethostname(),
            "pid": os.getpid(),
            "frontend": settings.FRONTEND_BIND,
            "backend": settings.BACKEND_BIND,
            "monitor": settings.MONITOR_BIND,
            "started_at": time.time(),
        }
        self.internal_errors = 0
        self.dropped_sends = 0
        self._shutdown_requests = 0
        self._signals_installed = False
        self._wake_r, self._wake_w = pysocket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.frontend = self._router(FRONTEND_HWM)
        self.backend = self._router()
        self.monitor = transport.make_socket(self.context, zmq.ROUTER)
        self.sockets = {FRONTEND: self.frontend, BACKEND: self.backend}

    def _router(self, hwm: int | None = None) -> zmq.Socket[Any]:
        # ROUTER_MANDATORY: an unroutable peer raises instead of a silent drop
        options = SocketOptions(sndhwm=hwm, router_mandatory=True)
        return transport.make_socket(self.context, zmq.ROUTER, options)

    def bind(self) -> None:
        """Bind the three ports; raises ``zmq.ZMQError`` naming the address on failure."""
        for sock, addr in (
            (self.frontend, self.settings.FRONTEND_BIND),
            (self.backend, self.settings.BACKEND_BIND),
            (self.monitor, self.settings.MONITOR_BIND),
        ):
            try:
                sock.bind(addr)
            except zmq.ZMQError as exc:
                raise zmq.ZMQError(exc.errno, f"cannot bind {addr}: {exc.strerror}") from exc
        log.info(
            "broker up: clients on %s, job managers on %s, monitor on %s (pid %d)",
            self.settings.FRONTEND_BIND,
            self.settings.BACKEND_BIND,
            self.settings.MONITOR_BIND,
            os.getpid(),
        )

    def install_signal_handlers(self) -> None:
        signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
        self._signals_installed = True
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.request_shutdown()

    def request_shutdown(self) -> None:
        """First call: graceful (KBYE, let in-flight jobs finish). Second: stop now."""
        self._shutdown_requests += 1
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def run(self) -> None:
        poller = zmq.Poller()
        for sock in (self.frontend, self.backend, self.monitor):
            poller.register(sock, zmq.POLLIN)
        poller.register(self._wake_r.fileno(), zmq.POLLIN)
        deadline = float("inf")
        core = self.core
        while True:
            now = self.clock()
            if self._shutdown_requests and not core.stopping:
                log.info(
                    "shutting down: KBYE sent to every peer; waiting up to %.0f s for "
                    "%d in-flight jobs",
                    self.grace,
                    len(core.inflight),
                )
                core.begin_shutdown()
                deadline = now + self.grace
            if core.stopping and (core.drained or now >= deadline or self._shutdown_requests > 1):
                self._flush(last=True)
                self._log_exit()
                return
            core.on_timer(now)
            self._flush()
            wake = min(core.next_deadline(), deadline)
            if core.trace:
                wake = min(wake, self._trace_due)  # lines wait: write them when due
            timeout = max(0.0, wake - self.clock())
            for sock, _ in poller.poll(int(timeout * 1000) + 1):
                if sock is self.monitor:
                    self._serve_monitor()
                elif sock is not self.frontend and sock is not self.backend:
                    self._clear_wakeups()
            self._drain_both()

    def _drain_both(self) -> None:
        """Take turns between job managers and clients until neither has anything.

        Replies from job managers return credit, so they never wait behind a flood
        of new jobs; polling again only when both are empty saves a system call
        per message under load.
        """
        core = self.core
        while True:
            got = self._drain(self.backend, core.on_backend)
            got += self._drain(self.frontend, core.on_frontend)
            if not got:
                return
            now = self.clock()
            if now >= core.next_deadline():
                core.on_timer(now)

    def _drain(
        self, sock: zmq.Socket[Any], handler: Callable[[bytes, Sequence[bytes], float], None]
    ) -> int:
        """Handle up to CHUNK waiting messages, then send what they produced."""
        now = self.clock()
        n = 0
        while n < CHUNK:
            # recv until EAGAIN: asking ZMQ_EVENTS first costs a mailbox check per message
            try:
                frames = wire.recv(sock)
            except zmq.Again:
                break
            n += 1
            try:
                handler(frames[0], frames[1:], now)
            except Exception:  # a bug must not take the broker down
                self.internal_errors += 1
                log.exception("internal error handling a message from %r", frames[0][:32])
        if n:
            self._flush()
        return n

    def _flush(self, last: bool = False) -> None:
        core = self.core
        if core.journal_ops:
            self._commit()  # before anything about those jobs leaves the broker
        if core.spill_requests:
            self._refill_spilled()
        if core.trace and self.tracer is not None:
            now = self.clock()
            if last or now >= self._trace_due or len(core.trace) >= TRACE_MAX_EVENTS:
                lines, core.trace = core.trace, []
                self.tracer.write(lines)
                self._trace_due = now + TRACE_WRITE_INTERVAL
        while core.out:
            batch, core.out = core.out, []
            for socket_id, identity, frames in batch:
                try:
                    wire.send(self.sockets[socket_id], [identity, *frames])
                except zmq.Again:
                    self.dropped_sends += 1
                    if self.dropped_sends % 1000 == 1:
                        log.warning(
                            "peer %r is not reading; dropped %d messages so far",
                            identity[:32],
                            self.dropped_sends,
                        )
                except zmq.ZMQError as exc:
                    if exc.errno != zmq.EHOSTUNREACH:
                        raise
                    core.peer_unreachable(socket_id, identity, self.clock())

    def _commit(self) -> None:
        """Write the loop turn's journal operations in one transaction. If that
        fails, the guaranteed jobs it held are refused, not acknowledged."""
        core = self.core
        assert self.journal is not None and core.journal_ops is not None
        ops, core.journal_ops = core.journal_ops, []
        try:
            self.journal.apply(ops)
        except JournalError as exc:
            unsaved = {op[1] for op in ops if op[0] == "put"}
            log.error("%s: refusing %d guaranteed jobs", exc, len(unsaved))
            core.unsave(unsaved, self.clock())
            kept = [m for m in core.out if not _dispatch_of(m, unsaved)]
            core.out = [_refusal(m, unsaved, str(exc)) for m in kept]
            refused = sum(1 for new, old in zip(core.out, kept, strict=True) if new is not old)
            if refused:
                core.count_refusal(REFUSED_JOURNAL, refused)
            if core.journal_ops:  # what unsave() queued (credit given back) needs no journal
                core.journal_ops = [op for op in core.journal_ops if op[1] not in unsaved]

    def _refill_spilled(self) -> None:
        core = self.core
        assert self.journal is not None
        names, core.spill_requests = core.spill_requests, set()
        for name in names:
            try:
                rows = self.journal.load_spilled(name, max(self.settings.MAX_PENDING // 4, 1))
            except JournalError as exc:
                log.error(
                    "%s: could not read back spilled jobs of %r; trying again later", exc, name
                )
                continue
            core.restore_spilled(name, rows, self.clock())
        if core.journal_ops:
            self._commit()

    def _serve_monitor(self) -> None:
        for _ in range(100):
            try:
                frames = self.monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            envelope, request = frames[:-1], frames[-1].strip()
            if len(frames) < 2:
                self.core.counters["protocol_errors"] += 1
                continue
            try:
                reply = self.monitor_reply(request[:65536])
            except Exception:
                self.internal_errors += 1
                log.exception("internal error answering the monitor")
                reply = b"ERROR internal error"
            try:
                self.monitor.send_multipart([*envelope, reply], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def monitor_reply(self, request: bytes) -> bytes:
        """``MONITOR``, ``MONITOR JSON``, ``DEADLETTERS [LIST|REQUEUE|PURGE] [ALL|id...]``."""
        words = request.split()
        command = b" ".join(words[:2]).upper()
        if command in (b"MONITOR", b"MONITOR JSON"):
            doc = self.status()
            return monitor.as_json(doc) if command.endswith(b"JSON") else monitor.as_lines(doc)
        if words and words[0].upper() == b"CANCEL" and len(words) > 1:
            now = self.clock()
            states: dict[str, list[str]] = {
                "cancelled": [],
                "stopping": [],
                "running": [],
                "unknown": [],
            }
            for job_id in words[1:]:
                states[self.core.cancel(job_id, now)].append(job_id.decode("utf-8", "replace"))
            self._flush()
            return monitor.as_json(states)
        if words and words[0].upper() == b"DEADLETTERS":
            result = self._dead_letter_command(words[1:])
            if result is not None:
                self._flush()
                return monitor.as_json(result)
        self.core.counters["protocol_errors"] += 1
        return (
            b"ERROR unknown command; send MONITOR, MONITOR JSON, CANCEL <id>... or "
            b"DEADLETTERS [LIST | REQUEUE ALL|<id>... | PURGE ALL|<id>...]"
        )

    def _dead_letter_command(self, words: list[bytes]) -> dict[str, Any] | None:
        action = words[0].upper() if words else b"LIST"
        if action == b"LIST":
            return {"dead_letters": self.core.dead_letters(), "count": len(self.core.dead)}
        ids: list[bytes] | None = words[1:] or None
        if ids == [b"ALL"] or ids == [b"all"]:
            ids = None
        elif ids is None:
            return {"error": "name the jobs, or ALL"}
        now = self.clock()
        if action == b"REQUEUE":
            return {"requeued": self.core.requeue_dead(ids, now)}
        if action == b"PURGE":
            return {"purged": self.core.purge_dead(ids, now)}
        return None

    def status(self) -> dict[str, Any]:
        doc = monitor.snapshot(self.core, self.clock(), time.time(), self.info)
        doc["counters"]["internal_errors"] = self.internal_errors
        doc["counters"]["dropped_sends"] = self.dropped_sends
        if self.tracer is not None:
            doc["counters"]["trace_written"] = self.tracer.written
            doc["counters"]["trace_dropped"] = self.tracer.dropped
        if self.journal is not None:
            doc["journal"] = self.journal.stats()
        return doc

    def _clear_wakeups(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass

    def _log_exit(self) -> None:
        journaled = self.journal is not None
        waiting = [j for q in self.core.queues.values() for j in q.pending]
        kept = sum(1 for j in waiting if journaled and j.headers.guarantee)
        in_flight = list(self.core.inflight.values())
        kept_running = sum(1 for j in in_flight if journaled and j.headers.guarantee)
        log.info(
            "broker stopped: %d jobs in flight, %d waiting; %d guaranteed kept in the "
            "journal, %d not guaranteed dropped",
            len(in_flight),
            len(waiting),
            kept + kept_running,
            len(waiting) - kept + len(in_flight) - kept_running,
        )

    def close(self) -> None:
        if self._signals_installed:
            signal.set_wakeup_fd(-1)
        for sock in (self.frontend, self.backend, self.monitor):
            sock.close(linger=0)
        self._wake_r.close()
        self._wake_w.close()
        if self.tracer is not None:
            self.tracer.close()
        if self.journal is not None:
            self.journal.close()


def _refusal(
    message: tuple[int, bytes, list[bytes]], unsaved: set[bytes], reason: str
) -> tuple[int, bytes, list[bytes]]:
    """An ACK for a job the journal could not save becomes an ERROR: the client
    must not believe it is guaranteed."""
    socket_id, identity, frames = message
    if socket_id == FRONTEND and len(frames) == 5 and frames[2] == F.ACK and frames[4] in unsaved:
        error = F.Error(frames[3], frames[4], f"not saved: {reason}", REFUSED_JOURNAL)
        return socket_id, identity, error.encode()
    return message


def _dispatch_of(message: tuple[int, bytes, list[bytes]], unsaved: set[bytes]) -> bool:
    """A REQUEST to a job manager for one of the jobs the journal could not save."""
    socket_id, _, frames = message
    return (
        socket_id == BACKEND
        and len(frames) > 3
        and frames[2] == F.REQUEST
        and frames[3].rpartition(b"#")[0] in unsaved
    )
