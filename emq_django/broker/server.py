"""The broker's server loop: the only part of the broker that touches sockets.

One thread; one ROUTER socket per configured port (``broker/ports``), or the
sockets a multi-socket port asks for (``Port.socket_specs``), made by
``emq_django.transport``, and a wake-up pipe for signals. It drains each ready
socket until it would block, hands the frames to that socket's port (which calls
the core), and sends the effects the core queued through the port each one's
peer or client came in by, never blocking. It blocks in poll until the next
timer is due: an idle broker uses no CPU.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket as pysocket
import time
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import replace
from operator import itemgetter
from types import FrameType
from typing import TYPE_CHECKING, Any

import zmq
from django.core.exceptions import ImproperlyConfigured
from zmq.backend import Socket as _BackendSocket

from emq_django import transport, wire
from emq_django.broker import exposure, memory, monitor
from emq_django.broker.core import BrokerConfig, BrokerCore
from emq_django.broker.effects import Acknowledge, Answer, Deliver, Published, Refuse, Send
from emq_django.broker.guard import Guard
from emq_django.broker.journal import Journal, JournalError, PutJob
from emq_django.broker.journal_writer import JournalWriter
from emq_django.broker.journals import open_journal
from emq_django.broker.lease_watch import LeaseWatch
from emq_django.broker.memory import IDLE, Reclaimer, allocator_name, rss_bytes, trim_heap
from emq_django.broker.ports import PORTS, Port
from emq_django.broker.ports.base import FULL, GONE, NEVER, SENT, Handler, SocketSpec
from emq_django.broker.refusal_log import RefusalLog
from emq_django.broker.spans import dispatch_spans
from emq_django.broker.topics import Event, TopicSpace
from emq_django.broker.trace import TraceWriter
from emq_django.broker.turns import TurnWatch
from emq_django.conf import EmqSettings
from emq_django.exceptions import LeaseLost
from emq_django.ids import IdGenerator
from emq_django.protocol.limits import REFUSED_JOURNAL, REFUSED_LEASE_LOST
from emq_django.security.allow import AllowList, KeyReloader, Loader, Saver
from emq_django.security.handshakes import HandshakeWatch
from emq_django.security.keys import server_keys
from emq_django.security.roles import zap_domain
from emq_django.security.zap import ZapHandler

if TYPE_CHECKING:
    from emq_django.broker.journal_pg import PgJournal

log = logging.getLogger(__name__)

CHUNK = 256  # messages from one socket before turning to the next
REBIND_TRIES = 50  # a publisher bound again after a revocation (``_rebind_publishers``)
REBIND_PAUSE = 0.01  # seconds between tries while libzmq closes the old listener
# the backend's getsockopt: ZMQ_EVENTS as a plain int (typed int | bytes)
_get: Callable[[zmq.Socket[Any], int], int] = _BackendSocket.get  # type: ignore[assignment]
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
# events taken in one loop turn (publish batches carry many a message): then the
# turn is committed and sent before more are read, so subscribers get the first
# events while the broker reads the rest
TURN_EVENTS = 1024
TURN_BYTES = 4 * 1024 * 1024  # and their data (CHUNK messages of 16 KB events)
# spilled jobs read back from the journal per queue and loop turn: reading 25,000
# at once (and committing their new state) held the loop for 1-3 s on a loaded
# machine, long enough for job managers to miss heartbeats; the loop turns again
# at once while a queue still wants more (see ``serve``)
REFILL_BATCH = 2_000
# Trace lines are buffered and written at most every TRACE_WRITE_INTERVAL (when
# the broker has handled a batch of messages, or wakes up for them), or as soon
# as TRACE_MAX_EVENTS wait. Writing at the end of every loop turn instead (a
# system call every few jobs under load) took 5% of the broker's time while it
# drained no-op jobs (py-spy).
TRACE_MAX_EVENTS = 4096
TRACE_WRITE_INTERVAL = 0.02  # seconds
_TO_CLIENT = (Answer, Acknowledge, Refuse, Send)  # effects addressed to a ClientRef
# the journal operations a turn may commit on the writer's thread: the jobs' own
# (a done row with its kept reply among them: broker/kept_replies.py)
_OFF_LOOP = frozenset(("put", "done", "reply"))
_op_kind = itemgetter(0)
_NO_PEER = frozenset((*_TO_CLIENT, Published))  # the effects not addressed to a peer
_NO_IDS: frozenset[bytes] = frozenset()
_NO_PEERS: frozenset[int] = frozenset()


def _refusal_code(exc: BaseException) -> str:
    """The refusal code of guaranteed jobs a failed commit leaves unsaved: a lease
    lost to another broker is no fault of the job (the client sends it again, to
    the new active broker), unlike a journal that cannot write."""
    return REFUSED_LEASE_LOST if isinstance(exc, LeaseLost) else REFUSED_JOURNAL


_backend_recv = zmq.backend.Socket.recv


class _NoPort:
    carried = 0  # what ``_drain`` reads of a port it was not given


_NO_PORT: Any = _NoPort()
_backend_send = zmq.backend.Socket.send
_NOBLOCK = int(zmq.NOBLOCK)
_MORE_NOBLOCK = int(zmq.SNDMORE) | _NOBLOCK


class _Outlet:
    """A port's way out (``ports.base.Outlet``): the server's one send path and one
    error policy. Never blocks; a peer not reading loses the message (counted in
    ``dropped_sends`` and said every 1,000th), an unroutable one is the port's
    ``unroutable``."""

    __slots__ = ("server", "port", "sock", "touched")

    def __init__(self, server: BrokerServer, port: Port, sock: zmq.Socket[Any]) -> None:
        self.server = server
        self.port = port
        self.sock = sock
        self.touched = server._touched

    def to_peer(self, identity: bytes, frames: list[bytes]) -> bool:
        sock = self.sock
        self.touched.add(sock)
        send = _backend_send
        try:
            # as wire.send: the identity first (a message is atomic: if its first
            # frame is refused, nothing of it leaves)
            send(sock, identity, _MORE_NOBLOCK)
            for frame in frames[:-1]:
                send(sock, frame, _MORE_NOBLOCK)
            send(sock, frames[-1], _NOBLOCK)
        except zmq.Again:
            self.server.dropped(identity)
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            self.port.unroutable(identity, self.server.clock())
            return False
        return True

    def to_socket(self, name: str, frames: list[bytes]) -> int:
        sock = self.server.named[(self.port, name)]
        self.touched.add(sock)
        try:
            wire.send(sock, frames)
        except zmq.Again:
            return FULL
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            return GONE
        return SENT

    def clock(self) -> float:
        return self.server.clock()


class BrokerServer:
    def __init__(
        self,
        settings: EmqSettings,
        context: zmq.Context[Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
        shutdown_grace: float | None = None,
        new_journal: bool = False,
        load_keys: Loader | None = None,
        save_seen: Saver | None = None,
        ports: Sequence[tuple[str, type[Port]]] = PORTS,
        journal: Journal | PgJournal | None = None,
        ha: LeaseWatch | None = None,
    ) -> None:
        """``load_keys``: where the allow-list comes from when the broker runs CURVE
        (``manage.py emq_broker`` passes the ``AuthorizedKey`` table's reader,
        ``security/store.py``: the server, below the Django apps, does not import
        it); ``save_seen``: where the names of the keys seen go (None: nowhere).
        ``ports``: the protocols served, each as the setting with its bind address
        and its port class (an empty or missing address turns it off); by default
        ``ports.PORTS``. ``journal``: opened already (fenced), else EMQ_JOURNAL_PATH's.
        ``ha``: its lease (``broker/ha.py``)."""
        if load_keys is None and settings.CURVE_SECRET_KEY:  # before anything is opened
            raise ImproperlyConfigured(
                "the broker runs CURVE (EMQ_CURVE_SECRET_KEY is set) but was given no "
                "key loader: pass BrokerServer(load_keys=...) (manage.py emq_broker "
                "passes emq_django.security.store.load_authorized_keys)"
            )
        self.settings = settings
        self.context = context or zmq.Context.instance()
        self.clock = clock
        self.grace = settings.SHUTDOWN_GRACE if shutdown_grace is None else shutdown_grace
        self.core = BrokerCore(
            BrokerConfig.from_settings(settings),
            clock(),
            trace=bool(settings.TRACE_DIR),
            topics=TopicSpace(settings.TOPIC_RETENTION),
        )
        self.core.wall_offset = time.time() - clock()
        self.core.spans = dispatch_spans(settings.OTEL_BROKER_SPANS)
        self.ha = ha
        self.journal: Journal | PgJournal | None = journal
        if journal is None:  # EMQ_JOURNAL_URL's or EMQ_JOURNAL_PATH's (broker/journals.py)
            self.journal = open_journal(settings, new=new_journal)
        self._writer: JournalWriter | None = None  # commits off the loop (PostgreSQL)
        self._refusals = RefusalLog(log)  # one ERROR line a second while commits fail
        self._held: list[Any] = []  # the effects that wait for the commit in flight
        self._held_puts: set[bytes] = set()  # the new jobs that commit saves
        # the peers something in ``_held`` goes to (made once a commit, not per turn)
        self._held_peers: set[int] = set()
        # ``_turn_puts``: the operation list read so far, how far, the new ids in it
        self._puts_of: list[Any] | None = None
        self._puts_read = 0
        self._puts_ids: set[bytes] = set()
        # ``_send_ahead``: the effect list read so far, how far (all of it kept), and
        # the peers something kept goes to
        self._ahead_of: list[Any] | None = None
        self._ahead_read = 0
        self._ahead_peers: set[int] = set()
        if self.journal is not None:
            if getattr(self.journal, "commits_off_loop", False):
                self._writer = JournalWriter(self.journal, self._commit_over)
            self.core.life.journal_ops = []
            counts = self.core.restore(self.journal.load(), clock())
            waiting = sum(n for state, n in counts.items() if state != "done")
            log.info(
                "journal %s: %d guaranteed jobs reloaded %s",
                self.journal.path,
                waiting,
                {k: v for k, v in counts.items() if k != "done"},
            )
            self.core.topics.attach(self.journal, self.core.life)
            if self.core.topics.last_seq:
                self.core.next_topic_prune = clock()  # apply today's retention rules
            log.info("topics: the event sequence goes on from %d", self.core.topics.last_seq)
        self.tracer: TraceWriter | None = None
        self._trace_due = 0.0  # clock: from when waiting trace lines are written
        if settings.TRACE_DIR:
            self.tracer = TraceWriter(settings.TRACE_DIR)
        ids = IdGenerator()
        self.ports: list[Port] = []
        for setting, port_class in ports:
            address = getattr(settings, setting, "")
            if address:
                port = port_class(self.core, address)
                port.configure(settings)
                if hasattr(port, "new_id"):
                    port.new_id = ids  # one id sequence for the whole broker
                self.ports.append(port)
        # the ports with timers of their own (asked each loop turn; the others never)
        self._timed_ports = [p for p in self.ports if type(p).next_timer is not Port.next_timer]
        self.info = {
            "host": pysocket.gethostname(),
            "pid": os.getpid(),
            **{p.name: p.address for p in self.ports},
            "started_at": time.time(),
        }
        self.internal_errors = 0
        self.dropped_sends = 0
        # ports holding effects back to send together (``Port.flush``), and when the
        # first of them wants flushing again with no new effect (a lazy ACK's time)
        self._holding = [p for p in self.ports if type(p).flush is not Port.flush]
        self._hold_due = NEVER
        # ports holding events back to send together (``Port.flush_published``)
        self._batching = [
            p for p in self.ports if type(p).flush_published is not Port.flush_published
        ]
        self.reclaimer = Reclaimer()
        self.turns = TurnWatch()  # slow loop turns and what held them (``broker/turns.py``)
        self._shutdown_requests = 0
        self._signals_installed = False
        self._wake_r, self._wake_w = pysocket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        # every socket: (port, spec, socket, its reader, whether a ROUTER)
        self.endpoints: list[tuple[Port, SocketSpec, zmq.Socket[Any], Handler, bool]] = []
        self.named: dict[tuple[Port, str], zmq.Socket[Any]] = {}
        self._round_rank: list[int] = []  # per endpoint (``bind``)
        self._timed_endpoints: set[int] = set()  # the sockets of ports with timers
        self._port_due = 0.0  # when ``_port_timers`` is due next
        # sockets sent on or not read to the end since last asked for ZMQ_EVENTS (run)
        self._touched: set[zmq.Socket[Any]] = set()
        self._index: dict[zmq.Socket[Any], int] = {}  # a socket's place in ``endpoints``
        self.sockets: dict[Port, zmq.Socket[Any]] = {}  # each port's first socket
        # CURVE on every socket of every port when the broker has a secret key
        self.curve = server_keys(settings)
        self.allow: AllowList | None = None
        self.guard: Guard | None = None
        self.zap: ZapHandler | None = None
        self.handshakes: HandshakeWatch | None = None
        self.reloader: KeyReloader | None = None
        if self.curve is not None:
            self._secure(settings, load_keys, save_seen)
        for port in self.ports:
            for spec in port.socket_specs():
                options = spec.options
                if self.curve is not None:
                    options = replace(options, curve=self.curve, zap_domain=zap_domain(spec.roles))
                sock = transport.make_socket(self.context, spec.kind, options)
                handler = port.handler_for(spec.name)
                if self.guard is not None:
                    handler = self.guard.wrap(port, spec.name, handler)
                if self.handshakes is not None:
                    self.handshakes.watch(sock, spec.name)
                self._index[sock] = len(self.endpoints)
                self.endpoints.append((port, spec, sock, handler, spec.kind == zmq.ROUTER))
                if type(port).next_timer is not Port.next_timer:
                    self._timed_endpoints.add(len(self._round_rank))
                # the order a round reads ready sockets in: event sockets last
                self._round_rank.append(
                    len(self._round_rank) + (spec.name in port.event_sockets) * 1000
                )
                self.named[(port, spec.name)] = sock
                self.sockets.setdefault(port, sock)
            port.attach(_Outlet(self, port, self.sockets[port]), self.status)

    def _secure(
        self, settings: EmqSettings, load_keys: Loader | None, save_seen: Saver | None
    ) -> None:
        """The allow-list (loaded now: a broker that cannot read it does not start),
        the ZAP handler, the per-message guard and the background reloader."""
        assert load_keys is not None  # (checked first thing in __init__)
        self.allow = AllowList(load_keys())
        self.guard = Guard(self.allow)
        self.zap = ZapHandler(self.context, self.allow)
        self.handshakes = HandshakeWatch(self.context)
        self.reloader = KeyReloader(
            self.allow, load_keys, save_seen, settings.KEYS_RELOAD, self.request_wakeup
        )

    def bind(self) -> None:
        """Bind every port; raises ``zmq.ZMQError`` naming the address on failure
        (and when CURVE is on and another ZAP handler holds this context's), and
        ``ImproperlyConfigured`` (before binding any) when one would carry plain text
        to other machines (``broker/exposure.py``)."""
        exposure.require_safe_binds(
            self.settings, [(spec.name, spec.address) for _, spec, _, _, _ in self.endpoints]
        )
        if self.zap is not None and self.reloader is not None and self.allow is not None:
            self.zap.start()  # before the first handshake can happen
            if self.handshakes is not None:
                self.handshakes.start()
            self.reloader.start()
            log.info(
                "CURVE on every port (public key %s); %d authorized keys, reloaded every %g s",
                self.curve.public.decode() if self.curve else "?",
                len(self.allow.names()),
                self.reloader.interval,
            )
        for _, spec, sock, _, _ in self.endpoints:
            try:  # with a lease, an address this process let go of a moment ago
                self._bind_again(sock, spec) if self.ha else sock.bind(spec.address)
            except zmq.ZMQError as exc:
                raise zmq.ZMQError(
                    exc.errno, f"cannot bind {spec.address} ({spec.name}): {exc.strerror}"
                ) from exc
        log.info(  # a standby's is not "broker up": it serves nothing yet
            "%s up: %s (pid %d)",
            "standby" if self.ha is not None and self.ha.role == "standby" else "broker",
            ", ".join(f"{spec.name} on {spec.address}" for _, spec, _, _, _ in self.endpoints),
            os.getpid(),
        )

    def tune_gc(self) -> None:
        """The cyclic collector tuned for the broker's process (``memory.tune_gc``;
        its command calls this, tests that run a broker in their own process do not)."""
        memory.tune_gc()

    def install_signal_handlers(self, handler: Callable[[int, Any], None] | None = None) -> None:
        """SIGTERM and SIGINT go to ``handler`` (by default: shut down)."""
        signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
        self._signals_installed = True
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, handler or self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.request_shutdown()

    def request_wakeup(self) -> None:
        """Wake the loop (from another thread): the allow-list lost a key."""
        try:
            self._wake_w.send(b"w")
        except OSError:
            pass

    def request_shutdown(self) -> None:
        """First call: graceful (goodbye, let in-flight jobs finish). Second: stop now."""
        self._shutdown_requests += 1
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def run(self) -> str | None:
        """The loop, until shut down (None) or the lease says to leave (its reason:
        ``broker/lease_watch.py``, asked before any socket is read when due). It
        sleeps in one ``poll`` of the sockets' ``ZMQ_FD`` file descriptors and the
        wake-up pipe, not in ``zmq_poll`` of the sockets:
        ``zmq_poll`` asks every socket for ZMQ_EVENTS before and after it sleeps,
        and each ask of an idle socket is a ``poll`` and a ``getpid`` system call
        in libzmq; with this broker's nine sockets that was about 50 system calls
        per Majordomo round trip (strace), and as much CPU per round trip as
        majortomo's whole broker. A ZMQ_FD only says that the socket has commands
        to process, and any operation on the socket may process them, so the FD
        of a socket that was read from (and stopped before it would block) or
        sent on is not trusted: ``_touched`` holds those sockets, and each is
        asked for ZMQ_EVENTS before the loop sleeps (``_waiting``)."""
        poller = select.poll()  # file descriptors only: zmq_poll would poll twice
        by_fd: dict[int, int] = {}
        for i, (_, _, sock, _, _) in enumerate(self.endpoints):
            fd: int = sock.getsockopt(zmq.FD)  # type: ignore[assignment]
            by_fd[fd] = i
            poller.register(fd, select.POLLIN)
        wake_fd = self._wake_r.fileno()
        poller.register(wake_fd, select.POLLIN)
        self._touched.update(self._index)  # ask every socket once before the first sleep
        deadline = float("inf")
        core = self.core
        endpoints = self.endpoints
        watch = self.turns
        watch.watch_gc()
        watch.begin()
        slept_at, allowed = self.clock(), 0.0  # the last poll: when, and for how long
        ha = self.ha
        while True:
            now = self.clock()
            held_up = now - slept_at - allowed  # past the poll's time-out: held up
            if held_up > core.config.heartbeat_interval:
                core.stalled(held_up, now)
            if self._shutdown_requests and not core.stopping:
                log.info(
                    "shutting down: goodbye sent to every peer; waiting up to %.0f s for "
                    "%d in-flight jobs",
                    self.grace,
                    len(core.inflight),
                )
                core.begin_shutdown()
                deadline = now + self.grace
            if core.stopping and (core.drained or now >= deadline or self._shutdown_requests > 1):
                self._flush(last=True)
                self._log_exit()
                return None
            if self.guard is not None and self.guard.version != self.guard.allow.version:
                self.guard.revoke(self.ports, core, now)
                self._rebind_publishers(self.guard.allow.take_lost_roles())
            core.on_timer(now)
            self._flush()
            # busy or not, when due: a replay a port paces goes on under load too.
            # Due again as soon as a timed port's socket is read (``_drain_ready``)
            if now >= self._port_due:
                self._port_due = self._port_timers(now)
            reclaim = self.reclaimer.due(core.footprint(), now)
            if reclaim is not None:
                self._reclaim(reclaim)
            ready, ha_due = self._waiting(), NEVER if ha is None else ha.due
            if ready:
                timeout = 0  # messages wait: only see which other sockets have some
            else:
                wake = min(core.next_deadline(), deadline, self._port_due, self._hold_due, ha_due)
                if core.life.spill_requests:
                    wake = now  # a queue wants more of its spilled jobs: read on, after a poll
                if core.tracer is not None and core.tracer.lines:
                    wake = min(wake, self._trace_due)  # lines wait: write them when due
                timeout = int(max(0.0, wake - self.clock()) * 1000) + 1
            watch.end()
            slept_at, allowed = self.clock(), timeout / 1000
            signalled = poller.poll(timeout)
            watch.begin()
            if ha is not None and self.clock() >= ha.due and (leave := ha.tick(self.clock())):
                return leave
            if not signalled and not ready:
                # a timer's turn: ask every socket (a safety net, at the timers' pace)
                self._touched.update(self._index)
                continue
            for fd, _ in signalled:
                if fd == wake_fd:  # a signal
                    self._clear_wakeups()
                    continue
                i = by_fd[fd]
                if i not in ready and _get(endpoints[i][2], _EVENTS) & _POLLIN:
                    ready.append(i)
            if ready:
                if len(ready) > 1:
                    ready.sort(key=self._round_rank.__getitem__)
                self._drain_ready(ready)

    def _waiting(self) -> list[int]:
        """The sockets used since they were last asked (``_touched``) on which a
        message waits (ZMQ_EVENTS), as indexes in ``endpoints``."""
        touched = self._touched
        if not touched:
            return []
        index = self._index
        ready = [index[sock] for sock in touched if _get(sock, _EVENTS) & _POLLIN]
        touched.clear()
        return ready

    def _drain_ready(self, ready: list[int]) -> None:
        """Read each socket that has messages, up to CHUNK messages each, in the
        ports' order: replies from workers return credit, so they never wait
        behind a flood of new jobs (workers' ports come first); the sockets that
        bring events come last (``Port.event_sockets``). A socket not
        read until EAGAIN is asked again before the loop sleeps (``_drain``).
        """
        endpoints = self.endpoints
        n = 0
        timed = self._timed_endpoints
        for i in ready:
            port, _, sock, handle, routed = endpoints[i]
            port.carried = 0
            n += self._drain(sock, handle, routed, flush=False, port=port)
            if i in timed:  # its port's timers may have changed (a new session, a replay)
                self._port_due = 0.0
        self.turns.count("messages", n)
        self._flush()  # one journal commit per round, not per socket

    def _rebind_publishers(self, lost: set[str]) -> None:
        """A PUB socket cannot stop sending to one of its peers: after a key lost a
        role, each publisher admitting that role is unbound (libzmq closes every
        connection it accepted) and bound again. Its other subscribers connect
        again by themselves, through a fresh handshake, which the revoked key fails
        (and is told: ZAP 400); a sequence gap sends them to the snapshot."""
        for _, spec, sock, _, _ in self.endpoints:
            if spec.kind not in (zmq.PUB, zmq.XPUB):
                continue
            if spec.roles and not lost & set(spec.roles):
                continue
            sock.unbind(sock.getsockopt_string(zmq.LAST_ENDPOINT))
            self._bind_again(sock, spec)
            self._touched.add(sock)
            if self.guard is not None:
                self.guard.counters["publishers_rebound"] += 1
            log.warning("bound %s again on %s: a key lost access", spec.name, spec.address)

    def _bind_again(self, sock: zmq.Socket[Any], spec: SocketSpec) -> None:
        """libzmq closes the listener in its I/O thread: retry briefly while the
        address is still taken."""
        for _ in range(REBIND_TRIES - 1):
            try:
                sock.bind(spec.address)
                return
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EADDRINUSE:
                    raise
                time.sleep(REBIND_PAUSE)
        sock.bind(spec.address)

    def _port_timers(self, now: float) -> float:
        """Run the ports' timers that are due (``Port.on_timer``) and send what they
        return; the earliest timer still to come (``inf`` if none)."""
        wake = float("inf")
        for port in self._timed_ports:
            due = port.next_timer()
            if due is None:
                continue
            if due <= now:
                self._send_port_frames(port, port.on_timer(now))
                port.pump(now, port.outlet.to_socket)
                due = port.next_timer()
                if due is None:
                    continue
            wake = min(wake, due)
        return wake

    def _send_port_frames(self, port: Port, messages: list[tuple[str, list[bytes]]]) -> None:
        """Send what a port hook returned, (socket spec name, whole frames) each, never
        blocking: a full pipe is a dropped send, a gone peer the port's ``unroutable``."""
        to_socket = port.outlet.to_socket
        for name, frames in messages:
            sent = to_socket(name, frames)
            if sent == FULL:
                self.dropped_sends += 1
            elif sent == GONE:
                port.unroutable(frames[0], self.clock())

    def _drain(
        self,
        sock: zmq.Socket[Any],
        handle: Handler,
        routed: bool = True,
        flush: bool = True,
        port: Port | None = None,
    ) -> int:
        """Handle up to CHUNK waiting messages, then (``flush``) send what they
        produced. ``routed``: a ROUTER, whose first frame is the sender's identity.
        Reads until EAGAIN: asking ZMQ_EVENTS before each message would cost a
        mailbox check (a system call) per message under load. After the first
        message, though, ZMQ_EVENTS is asked once: when that was the only one (a
        request-reply round trip), the EAGAIN would have cost the same system call
        and a Python exception besides (zmq.Again: 8% of the broker's time per
        Majordomo round trip, py-spy).
        ``_drain_ready`` flushes once per round instead: producers' messages and
        consumers' acks of the same round share one journal transaction.
        A message that carried several jobs (REQUESTS: ``port.carried``) counts as
        that many towards CHUNK, so that a turn does about as much work as before."""
        now = self.clock()
        if port is None:
            port = _NO_PORT
        if routed and self.guard is None:
            return self._drain_router(sock, handle, now, flush, port)
        recv = wire.recv if self.guard is None else self.guard.recv
        n = 0
        more = True
        replied = False  # sent on since ZMQ_EVENTS was last asked
        topics = self.core.topics
        unsaved = topics.unsaved  # events taken this turn (with a journal)
        while more and len(unsaved) < TURN_EVENTS and topics.unsaved_bytes < TURN_BYTES:
            try:
                frames = recv(sock)
            except zmq.Again:
                break
            n += 1
            if n == 1:
                more = bool(_get(sock, _EVENTS) & _POLLIN)
            elif n + port.carried >= CHUNK:
                more = False
            try:
                if routed:
                    back = handle(frames[0], frames[1:], now)
                    if back is not None:
                        replied = True
                        wire.send(sock, [frames[0], *back])
                else:
                    back = handle(b"", frames, now)
                    if back is not None:
                        replied = True
                        wire.send(sock, back)
            except zmq.ZMQError:
                self.dropped_sends += 1
            except Exception:  # a bug must not take the broker down
                self.internal_errors += 1
                log.exception("internal error handling a message from %r", frames[0][:32])
        else:
            # not ended by EAGAIN: CHUNK messages read, or the first one was the only
            # one; then a message may wait that the socket's FD will not signal
            if more or n + port.carried >= CHUNK or replied:  # more: a turn's events are enough
                self._touched.add(sock)
        if n and flush:
            self._flush()
        return n

    def _drain_router(
        self, sock: zmq.Socket[Any], handle: Handler, now: float, flush: bool, port: Any
    ) -> int:
        """``_drain`` for a ROUTER without CURVE's guard (the hot path). The first
        frame, the sender's identity, is read straight into bytes: libzmq always
        flags it as followed by more, so it needs no ``zmq.Frame`` (a Frame costs
        about 0.6 µs more than a copy, and there are two messages per job); the
        rest are read as ``wire.recv`` does, frame by frame until the last."""
        recv = _backend_recv
        n = 0
        more = True
        replied = False  # sent on since ZMQ_EVENTS was last asked (see ``_drain``)
        topics = self.core.topics
        unsaved = topics.unsaved  # events taken this turn (with a journal): as ``_drain``
        while more and len(unsaved) < TURN_EVENTS and topics.unsaved_bytes < TURN_BYTES:
            try:
                identity = recv(sock, _NOBLOCK, True)
            except zmq.Again:
                break
            frame = recv(sock, _NOBLOCK, False)
            frames = [frame.bytes]
            while frame.more:
                frame = recv(sock, _NOBLOCK, False)
                frames.append(frame.bytes)
            n += 1
            if n == 1:
                more = bool(_get(sock, _EVENTS) & _POLLIN)
            elif n + port.carried >= CHUNK:
                more = False
            try:
                back = handle(identity, frames, now)
                if back is not None:
                    replied = True
                    wire.send(sock, [identity, *back])
            except zmq.ZMQError:
                self.dropped_sends += 1
            except Exception:  # a bug must not take the broker down
                self.internal_errors += 1
                log.exception("internal error handling a message from %r", identity[:32])
        else:
            # not ended by EAGAIN: as in ``_drain``, the socket is asked before the
            # loop sleeps, since its FD may not signal a message already waiting
            if more or n + port.carried >= CHUNK or replied:  # more: a turn's events are enough
                self._touched.add(sock)
        if n and flush:
            self._flush()
        return n

    def _flush(self, last: bool = False) -> None:
        core = self.core
        writer = self._writer
        if writer is not None and writer.busy:
            if not last and not writer.done():  # what this turn made waits for it
                if core.out:
                    ops = core.life.journal_ops
                    turn = self._turn_puts(ops) if ops else _NO_IDS
                    self._send_ahead(self._held_puts, turn, self._held_peers)
                return
            self._end_write()
        if core.life.journal_ops:
            puts = self._turn_puts(core.life.journal_ops)
            if core.out:
                self._send_ahead(puts, _NO_IDS, _NO_PEERS)
            if writer is None or last or not self._write_off_loop(puts):
                self._commit()  # before anything about those jobs leaves the broker
        if core.life.spill_requests:
            self._refill_spilled()
        tracer = core.tracer
        if tracer is not None and tracer.lines and self.tracer is not None:
            now = self.clock()
            if last or now >= self._trace_due or len(tracer.lines) >= TRACE_MAX_EVENTS:
                self.tracer.write(tracer.take())
                self._trace_due = now + TRACE_WRITE_INTERVAL
                self.turns.add("trace", self.clock() - now)
        self._send_out(last)

    def _send_out(self, last: bool = False) -> None:
        """Send every effect in ``core.out`` (and what sending them makes)."""
        core = self.core
        holding = self._holding
        due = NEVER
        while True:
            batch, core.out = core.out, []
            for effect in batch:
                kind = type(effect)
                if kind is Published:
                    self._publish(effect.event)  # type: ignore[union-attr]
                    continue
                to: Any = effect.client if kind in _TO_CLIENT else effect.peer  # type: ignore[union-attr]
                to.port.post(to, effect)
            due = NEVER
            for port in holding:  # what the ports held back to go together
                due = min(due, port.flush(last))
            if not core.out:
                break
        self._hold_due = due
        for port in self._batching:  # events held back to go out together
            self._send_port_frames(port, port.flush_published())

    def _turn_puts(self, ops: list[Any]) -> set[bytes]:
        """The ids of the jobs ``ops`` (``journal_ops``) save anew. While a commit is
        in flight, the operations of every turn gather there and each turn asks: only
        what was appended since the last call is read. A list handed over or
        filtered is replaced by a new one (ours is kept, so it is never another's
        id); in place, only a done becomes a reply (``core._keep_reply``)."""
        n = len(ops)
        if ops is not self._puts_of or n < self._puts_read:
            self._puts_of, self._puts_read, self._puts_ids = ops, 0, set()
        if n > self._puts_read:
            new = ops[self._puts_read :] if self._puts_read else ops
            self._puts_ids.update(op.job_id for op in new if type(op) is PutJob)
            self._puts_read = n
        return self._puts_ids

    def _write_off_loop(self, puts: set[bytes]) -> bool:
        """Hand the turn's operations (``puts``: the ids of its new jobs) to the
        writer (``broker/journal_writer.py``) when they are puts and dones only (no
        events: those the topics count as saved at their commit); what the turn
        made waits for the commit in ``_held``. False: commit on the loop."""
        core = self.core
        ops = core.life.journal_ops
        assert self._writer is not None and ops is not None
        if core.topics.unsaved or not _OFF_LOOP.issuperset(map(_op_kind, ops)):
            return False
        core.life.journal_ops = []
        self._held, core.out = core.out, []
        self._held_puts = puts
        self._held_peers = {
            id(e.peer)  # type: ignore[union-attr]
            for e in self._held
            if type(e) not in _NO_PEER  # an ACK (the most held) has a client, no peer
        }
        self._writer.submit(ops)
        return True

    def _end_write(self) -> None:
        """Wait for the commit in flight, then send what waited for it; if it failed,
        its new jobs are refused (and taken back from what was made since)."""
        core = self.core
        assert self._writer is not None
        started = time.perf_counter()
        error = self._writer.wait()
        self.turns.add("commit", time.perf_counter() - started)  # what the loop waited
        held, self._held = self._held, []
        puts, self._held_puts = self._held_puts, set()
        self._held_peers = set()
        self._ahead_of = None  # what waited for this commit may go ahead now
        if error is None:  # what waited for it goes now, before what came after
            if self._refusals.held:
                self._refusals.flush()
            later, core.out = core.out, held
            self._send_out()
            core.out = later
            return
        core.out = held + core.out
        self._refusals.refused(error, len(puts))
        core.unsave(puts, self.clock())
        core.refuse_unsaved(puts, str(error), _refusal_code(error))
        if self.ha is not None:
            self.ha.commit_failed(error)

    def _commit_over(self) -> None:
        """From the writer's thread: wake the loop to send what waited."""
        try:
            self._wake_w.send(b"c")
        except OSError:
            pass

    def _send_ahead(
        self, held_puts: AbstractSet[bytes], turn_puts: AbstractSet[bytes], held: AbstractSet[int]
    ) -> None:
        """Deliver, before the turn's commit, the jobs the journal holds already.

        The commit waits for the disk (an fsync: 5-25 ms on a loaded machine, with
        PostgreSQL a network round trip besides) and the loop with it; a job
        manager that has just sent results back gets its next jobs only after it,
        so its workers idled for a commit per round trip. A job that this turn did
        not put is in the journal already (or is not guaranteed): sending it now
        promises nothing the journal does not keep. What concerns the new jobs
        (``held_puts``: the commit in flight's, ``turn_puts``: those made since)
        waits for the commit as before: their ACKs, their delivery (which a failed
        commit takes back, ``core.refuse_unsaved``); so do answers, events and
        everything else, and any delivery to a peer after something held for that
        peer (``held``: the peers of the effects the commit in flight holds; its
        messages keep their order).

        While a commit is in flight, each turn asks: only the effects appended
        since the last call are read (what was read before is all kept, and stays
        kept until that commit is over: ``_end_write`` starts the reading again),
        not every effect held so far once a turn."""
        core = self.core
        out = core.out
        if out is self._ahead_of and len(out) >= self._ahead_read:
            start, peers = self._ahead_read, self._ahead_peers
        else:
            start, peers = 0, set(held)  # peers with something held before
        ahead: list[Deliver] = []
        kept: list[Any] = []
        for effect in out[start:] if start else out:
            if type(effect) is Deliver:
                job_id = effect.job.id
                if (
                    job_id not in held_puts
                    and job_id not in turn_puts
                    and id(effect.peer) not in peers
                ):
                    ahead.append(effect)
                    continue
                peers.add(id(effect.peer))
            elif not isinstance(effect, _TO_CLIENT) and type(effect) is not Published:
                peers.add(id(effect.peer))  # type: ignore[union-attr]
            kept.append(effect)
        if ahead:
            del out[start:]
            out += kept
        self._ahead_of, self._ahead_read, self._ahead_peers = out, len(out), peers
        if not ahead:
            return
        for effect in ahead:
            to: Any = effect.peer  # a worker's peer has its port
            to.port.post(to, effect)
        for port in self._holding:  # what the ports held back to go together
            self._hold_due = min(self._hold_due, port.flush(False))

    def dropped(self, identity: bytes) -> None:
        """A peer's pipe was full: the message to it was dropped (the outlets' error
        policy)."""
        self.dropped_sends += 1
        if self.dropped_sends % 1000 == 1:
            log.warning(
                "peer %r is not reading; dropped %d messages so far",
                identity[:32],
                self.dropped_sends,
            )

    def _publish(self, event: Event) -> None:
        """Every port fans the event out to its own subscribers."""
        for port in self.ports:
            try:
                messages = port.on_published(event)
            except Exception:  # one port's bug must not keep the event from the others
                self.internal_errors += 1
                log.exception("internal error in the %s port publishing %d", port.name, event.seq)
                continue
            to_socket = port.outlet.to_socket
            for name, frames in messages:
                sent = to_socket(name, frames)
                if sent == FULL:
                    port.unsent_published(event, frames)
                elif sent == GONE:
                    port.unroutable(frames[0], self.clock())

    def _commit(self) -> None:
        """Write the loop turn's journal operations in one transaction. If that
        fails, the guaranteed jobs it held are refused, not acknowledged."""
        if self._writer is not None and self._writer.busy:
            self._end_write()  # one commit at a time, in order
        core = self.core
        life = core.life
        assert self.journal is not None and life.journal_ops is not None
        if not life.journal_ops:  # the failed write in flight took them back
            return
        ops, life.journal_ops = life.journal_ops, []
        watch = self.turns
        journal = self.journal
        started = time.perf_counter()
        try:
            events = len(core.topics.unsaved)
            journal.apply(ops)
            core.topics.saved()
            if self._refusals.held:
                self._refusals.flush()
            if events:
                watch.count("events", events)
        except JournalError as exc:
            lost = core.lose_unsaved_events()
            if lost:
                log.error("%s: %d events not kept and not sent", exc, lost)
            unsaved = {op.job_id for op in ops if type(op) is PutJob}
            self._refusals.refused(exc, len(unsaved))
            core.unsave(unsaved, self.clock())
            core.refuse_unsaved(unsaved, str(exc), _refusal_code(exc))
            if self.ha is not None:
                self.ha.commit_failed(exc)
        finally:
            watch.add("commit", time.perf_counter() - started)
            if journal.last_restart_s:
                watch.add("wal_restart", journal.last_restart_s)
            if journal.last_prune_s:
                watch.add("prune", journal.last_prune_s)

    def _refill_spilled(self) -> None:
        core = self.core
        assert self.journal is not None
        names, core.life.spill_requests = core.life.spill_requests, set()
        started = time.perf_counter()
        for name in names:
            try:
                limit = max(min(self.settings.MAX_PENDING // 4, REFILL_BATCH), 1)
                rows = self.journal.load_spilled(name, limit)
            except JournalError as exc:
                log.error(
                    "%s: could not read back spilled jobs of %r; trying again later", exc, name
                )
                continue
            left = core.queues[name].spilled
            core.restore_spilled(name, rows, self.clock())
            if len(rows) < limit or core.queues[name].spilled == left:
                # all there was, or nothing new: no reading on at once (no busy loop)
                core.life.spill_requests.discard(name)
        self.turns.add("refill", time.perf_counter() - started)
        if core.life.journal_ops:
            self._commit()

    def _reclaim(self, why: str) -> None:
        """Give back the memory a drained backlog left (``broker/memory.py``). The
        indexes are rebuilt once the drain is over (``IDLE``): that copies what
        they hold, which took 1-2 s half way down a drain of a million jobs on a
        loaded machine, while trimming the C heap takes milliseconds."""
        before, started = rss_bytes(), self.clock()
        if why == IDLE:
            self.core.compact()
        trimmed = trim_heap()
        self.turns.add("reclaim", self.clock() - started)
        log.info(
            "memory given back (%s) in %.0f ms: RSS %.0f -> %.0f MB; %d jobs held%s",
            why,
            (self.clock() - started) * 1000,
            before / 2**20,
            rss_bytes() / 2**20,
            self.core.footprint(),
            "" if trimmed else " (no malloc_trim here: the C heap keeps its free pages)",
        )

    def monitor_reply(self, request: bytes) -> bytes:
        """The monitor channel's answer to ``request`` (see ``ports/monitor.py``)."""
        for port in self.ports:
            reply = port.local_request(request, self.clock())
            if reply is not None:
                self._flush()
                return reply
        raise RuntimeError("the monitor port is not configured")

    def status(self) -> dict[str, Any]:
        doc = monitor.snapshot(self.core, self.clock(), time.time(), self.info)
        doc["counters"]["internal_errors"] = self.internal_errors
        doc["counters"]["dropped_sends"] = self.dropped_sends
        if self.tracer is not None:
            doc["counters"]["trace_written"] = self.tracer.written
            doc["counters"]["trace_dropped"] = self.tracer.dropped
        if self.journal is not None:
            doc["journal"] = self.journal.stats()
        doc["loop"] = self.turns.stats()
        if self.ha is not None:
            doc["ha"] = self.ha.status()
        doc["topics"] = self.core.topics.stats()
        doc["topics"]["ports"] = {
            port.name: {"subscribers": port.subscriber_count(), **port.topic_stats()}
            for port in self.ports
            if port.subscriber_count() or port.topic_stats()
        }
        if self.guard is not None and self.zap is not None and self.allow is not None:
            doc["counters"].update(self.zap.counters)
            doc["counters"].update(self.guard.counters)
            if self.handshakes is not None:
                doc["counters"].update(self.handshakes.counters)
            doc["security"] = {
                "curve": True,
                "public_key": self.curve.public.decode() if self.curve else None,
                "authorized_keys": len(self.allow.names()),
                "reload_errors": self.reloader.errors if self.reloader else 0,
            }
        life = self.core.life
        doc["memory"] = {
            "rss_bytes": rss_bytes(),
            "jobs": len(life.jobs),
            "spilled_ids": len(life.spilled_ids),
            "recent_ids": len(life.recent),
            "reclaims": self.reclaimer.reclaims,
            "allocator": allocator_name(),
        }
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

    def close(self, linger: int = 0) -> None:  # linger: ms for last refusals to leave
        self.turns.unwatch_gc()
        if self.reloader is not None:
            self.reloader.stop()
        if self.handshakes is not None:
            # the monitors first: the thread closes their pipes, and libzmq's I/O
            # thread would block for good on an event for a pipe nobody reads
            # (transport.HandshakeWatch.close)
            for _, _, sock, _, _ in self.endpoints:
                try:
                    sock.disable_monitor()
                except zmq.ZMQError:
                    pass
        if self.zap is not None:
            self.zap.stop()
        if self.handshakes is not None:
            self.handshakes.stop()
        if self._signals_installed:
            signal.set_wakeup_fd(-1)
        for _, _, sock, _, _ in self.endpoints:
            sock.close(linger=linger)
        self._wake_r.close()
        self._wake_w.close()
        if self.tracer is not None:
            self.tracer.close()
        if self._writer is not None:
            self._writer.close()  # the commit in flight ends first
        if self.journal is not None:
            self.journal.close()
