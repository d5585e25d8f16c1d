"""Publish and subscribe on the broker's topic space, through its Event BUS port.

``emq.publish("/orders/created", {"id": 1})`` sends the event to the collector
port, with its data in MessagePack whatever the content type (the released bus
decodes every data frame so): data as its MessagePack value (``application/json``
too), bytes as a MessagePack ``bin``, text (``text/...``) as a MessagePack string;
another content type raises ``ValueError``. Towards emq's broker, publishing is
confirmed (``confirm=True``, the default, ``EMQ_BUS_CONFIRM``): the events go in
emq's confirmed batches, and the broker answers once they are numbered and in the
journal (``publish_confirm.py``). Publishing is pipelined: a call returns at once,
and waits only when ``WINDOW_EVENTS`` events are unconfirmed; ``PublishUnconfirmed``
says how many events the broker refused or did not confirm within
``EMQ_BUS_CONFIRM_TIMEOUT``. ``emq.wait_published()`` waits for every confirmation
of the calling thread; at exit the process waits for them too, and logs an error
with the exact count of those that did not come. ``confirm=False`` sends the
document's plain PUB (never acknowledged), for a foreign Event BUS server such as
the released event-bus-zeromq. ``emq.publish_on_commit(...)`` publishes once the
surrounding database transaction commits (never if it rolls back).

``emq.subscribe("/orders/", since=seq)`` yields the events on topics under the
prefixes, in sequence order, each once, as the ZeroMQ Clone pattern gets them: a
SUB socket for live events and the snapshot port for what it missed. A jump in the
sequence may be a dropped message (a subscriber slower than its PUB pipe) or
events on other topics (the sequence is one for the whole broker); either way the
subscriber asks the snapshot for the events above the last one it has and
buffers live ones meanwhile. When nothing arrives for ``idle_check`` seconds it
asks too, so a lost last event, or a broker restart, is noticed. Use
``async for event in emq.asubscribe(...)`` in asyncio code.

With CURVE on (``EMQ_CURVE_SECRET_KEY``) every socket here carries this process's
keys, as the client's do. A broker that refuses the handshake (a key it does not
know, or none) raises ``HandshakeRefused`` with the reason: ``publish`` waits for
the outcome of its socket's first handshake (a round trip, once per thread; not
when nobody listens), a subscription as soon as libzmq reports it.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from typing import Any

import msgpack
import zmq
import zmq.asyncio
from zmq.backend import Socket as _BackendSocket

from emq_django import transport, wire
from emq_django.conf import EmqSettings, cached_settings
from emq_django.exceptions import (
    EventsExpired,
    HandshakeRefused,
    ProtocolError,
    PublishUnconfirmed,
)
from emq_django.protocol import eventbus
from emq_django.protocol.events import JSON, MSGPACK, OCTETS, Event, check_topic, matches
from emq_django.publish_confirm import WINDOW_EVENTS, Unconfirmed
from emq_django.security.keys import FROM_SETTINGS, CurveKeys, resolve
from emq_django.transport import HandshakeWatch, SocketOptions

log = logging.getLogger(__name__)

# the backend's getsockopt: ZMQ_EVENTS as a plain int (as the broker's loop asks it)
_get: Callable[[zmq.Socket[Any], int], int] = _BackendSocket.get  # type: ignore[assignment]
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)

SYNC_TIMEOUT = 5.0  # seconds without a SYNCEND before asking again (a restarted broker)
MAX_BUFFERED = 100_000  # live events held while a snapshot is asked for; then dropped
LATEST = 2**62  # SYNCSTART above every event: only the current sequence comes back
# after an answer with this many SYNCs (a long replay, during which live events
# may have been dropped), ask again at once rather than after idle_check
PAGE_HINT = 1000
PUBLISH_BATCH = 256  # events in one publish batch (publish_many)
PUBLISH_BATCH_BYTES = 256 * 1024  # data bytes in one (it may pass it by one event)
_BATCH_FIELDS_CAP = PUBLISH_BATCH * eventbus.PUBS_FIELDS
SEND_TIMEOUT = 5.0  # seconds a publish waits for room in the collector's pipe
# a publisher reads its handshake events every this many sends (and whenever the
# pipe is full): a refusal after a reconnect is reported, without a getsockopt
# (about as dear as sending a frame) on every publish
WATCH_EVERY = 256


class Received:
    """One event as a subscriber gets it: ``seq``, ``topic``, ``data`` (the
    MessagePack data, unpacked), ``producer``, ``uuid`` (its text, made when first
    read), ``ts`` (the producer's wall-clock time) and ``raw`` (the MessagePack
    data as received). Read-only by convention; one is made per event and per
    subscriber, so it is a plain slotted object."""

    __slots__ = ("seq", "topic", "data", "producer", "ts", "raw", "_uuid")

    def __init__(
        self, seq: int, topic: str, data: Any, producer: str, uuid: bytes, ts: float, raw: bytes
    ) -> None:
        self.seq = seq
        self.topic = topic
        self.data = data
        self.producer = producer
        self._uuid = uuid  # 16 bytes (anything else reads as "")
        self.ts = ts
        self.raw = raw

    @property
    def uuid(self) -> str:
        return eventbus.encode_uuid(self._uuid).decode()  # str(UUID), without making one

    def _key(self) -> tuple[Any, ...]:
        return (self.seq, self.topic, self.data, self.producer, self._uuid, self.ts, self.raw)

    def __eq__(self, other: object) -> bool:
        return type(other) is Received and self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"Received(seq={self.seq!r}, topic={self.topic!r}, data={self.data!r}, "
            f"producer={self.producer!r}, uuid={self.uuid!r}, ts={self.ts!r}, raw={self.raw!r})"
        )


def _url(settings: EmqSettings, name: str) -> str:
    url: str = getattr(settings, f"BUS_{name}_URL") or getattr(settings, f"BUS_{name}_BIND")
    if not url:
        raise ValueError(f"EMQ_BUS_{name}_URL (or EMQ_BUS_{name}_BIND) is not set")
    return url.replace("://0.0.0.0:", "://127.0.0.1:").replace("://*:", "://127.0.0.1:")


def _live_url(
    settings: EmqSettings, publish_url: str | None, batch_url: str | None
) -> tuple[str, bool]:
    """Where a subscriber reads live events, and whether that is the batch publisher."""
    if batch_url:
        return batch_url, True
    if not publish_url and (settings.BUS_BATCH_URL or settings.BUS_BATCH_BIND):
        return _url(settings, "BATCH"), True
    return publish_url or _url(settings, "PUBLISH"), False


# ---- publishing --------------------------------------------------------------------------


def encode_data(data: Any, content_type: str | None) -> tuple[bytes, str]:
    """The payload as the Event BUS wire carries it, and its content type (always
    MessagePack: the released bus MessagePack-decodes every data frame). Python
    data (``application/msgpack`` or ``application/json``: the value is the same)
    goes as MessagePack; bytes as a MessagePack ``bin`` (``application/octet-stream``,
    the default for bytes), as they are under ``application/msgpack`` (checked),
    or parsed under ``application/json``; text (``text/...``: a str, or UTF-8
    bytes) as a MessagePack string. Raises ``ValueError`` for any other content
    type or for data that cannot be encoded, naming which."""
    kind = content_type.split(";")[0].strip().lower() if content_type else ""
    try:
        if isinstance(data, (bytes, bytearray, memoryview)):
            return _encode_bytes(bytes(data), kind), MSGPACK
        if kind in ("", MSGPACK, JSON) or (kind.startswith(TEXT) and isinstance(data, str)):
            return bytes(msgpack.packb(data)), MSGPACK
    except (TypeError, OverflowError) as exc:
        raise ValueError(f"cannot encode the data as MessagePack: {exc}") from None
    if kind.startswith(TEXT):
        raise ValueError(f"{content_type} data is a str or UTF-8 bytes, not {type(data).__name__}")
    raise ValueError(_UNCARRIED % content_type)


TEXT = "text/"
_UNCARRIED = (
    "content type %r cannot be carried: the Event BUS data frame is MessagePack; "
    f"publish bytes as {OCTETS}, text as text/plain, data as {MSGPACK} or {JSON}"
)


_pack_bin = msgpack.Packer(use_bin_type=True, autoreset=True).pack


def _encode_bytes(raw: bytes, kind: str) -> bytes:
    if kind in ("", OCTETS):
        return _pack_bin(raw)
    if kind == MSGPACK:
        try:
            msgpack.unpackb(raw, raw=False, strict_map_key=False)
        except (ValueError, msgpack.UnpackException) as exc:
            raise ValueError(f"the bytes given as {MSGPACK} are not MessagePack: {exc}") from None
        return raw
    if kind == JSON:
        try:
            return bytes(msgpack.packb(json.loads(raw)))
        except ValueError as exc:
            raise ValueError(f"the bytes given as {JSON} are not JSON: {exc}") from None
    if kind.startswith(TEXT):
        try:
            return bytes(msgpack.packb(raw.decode("utf-8")))
        except UnicodeDecodeError:
            raise ValueError(f"{kind} bytes must be UTF-8 text") from None
    raise ValueError(_UNCARRIED % kind)


class _Publisher:
    """A DEALER to the collector, one per thread (a socket is not thread-safe) and
    made again after a fork, in a ZeroMQ context of the publisher's own.

    What ``publish`` returned from may still wait in the socket's pipe (a burst
    of ``publish_many`` is queued there at memory speed) or in the broker,
    unconfirmed. ``close_all`` runs at exit: it waits for the confirmations (up
    to ``EMQ_BUS_CONFIRM_TIMEOUT``), logs an error naming how many events did not
    get one, then closes the sockets and terminates their context. (The shared
    ``zmq.Context.instance()`` is never terminated at exit, and a process that
    exited with events still queued there lost them silently: the last 300 of
    20,000 in a bench round, 264,256 of 1,000,000 from two processes.)"""

    def __init__(self) -> None:
        self.local = threading.local()
        # every thread's socket, so a thread that ends does not leave its socket
        # to the garbage collector; closed at exit (sending what waits, up to linger)
        # (pid, socket, what it sent unconfirmed)
        self.sockets: list[tuple[int, zmq.Socket[Any], Unconfirmed]] = []
        self.watches: list[tuple[int, HandshakeWatch]] = []  # (pid, each socket's watch)
        self.context: zmq.Context[Any] | None = None
        self.context_pid = 0  # the process ``context`` was made in
        self.lock = threading.Lock()
        atexit.register(self.close_all)

    def close_all(self) -> None:
        """Wait for the confirmations of what this process published (logging the
        count of events that got none), close its sockets and terminate their
        context."""
        pid = os.getpid()
        with self.lock:
            sockets, self.sockets = self.sockets, []
            watches, self.watches = self.watches, []
            context = self.context if self.context_pid == pid else None
            self.context, self.context_pid = None, 0
        for watch_pid, watch in watches:  # first: HandshakeWatch.close
            if watch_pid == pid:
                watch.close()
        timeout = _confirm_timeout()
        for sock_pid, sock, unconfirmed in sockets:
            if sock_pid == pid and not sock.closed:  # never a parent's, after a fork
                _confirm_at_exit(sock, unconfirmed, timeout)
                sock.close(linger=0)
        if context is not None and not context.closed:
            context.term()

    def _forget(
        self, sock: zmq.Socket[Any], watch: HandshakeWatch, linger: int | None = None
    ) -> None:
        """Close one thread's socket and its watch (another address, or refused)."""
        with self.lock:
            self.sockets = [(p, s, u) for p, s, u in self.sockets if s is not sock]
            self.watches = [(p, w) for p, w in self.watches if w is not watch]
        watch.close()  # (first: HandshakeWatch.close)
        sock.close(linger=linger)

    def _context(self, pid: int) -> zmq.Context[Any]:
        with self.lock:
            if self.context is None or self.context_pid != pid:
                # after a fork the parent's context is left alone (never used here)
                self.context, self.context_pid = zmq.Context(), pid
            return self.context

    def socket(self, url: str, pid: int) -> zmq.Socket[Any]:
        """This thread's socket to ``url`` in process ``pid`` (``os.getpid()``),
        with this process's CURVE keys (``EMQ_CURVE_*``) when it has them."""
        local = self.local
        sock_: zmq.Socket[Any] | None = getattr(local, "sock", None)
        if getattr(local, "pid", None) != pid or local.url != url or sock_ is None or sock_.closed:
            if getattr(local, "pid", None) == pid and sock_ is not None:
                self._forget(sock_, local.watch)  # another address now (settings changed)
            # linger: what waits unconfirmed is waited for by close_all (confirmations)
            options = SocketOptions(linger=5000, curve=resolve(FROM_SETTINGS))
            sock, watch = transport.connect_watched(
                self._context(pid),
                zmq.DEALER,
                url,
                options,
                events=transport.HANDSHAKE_EVENTS | transport.CONNECT_RETRIED,
            )
            unconfirmed = Unconfirmed()
            with self.lock:
                self.sockets.append((pid, sock, unconfirmed))
                self.watches.append((pid, watch))
            local.unconfirmed = unconfirmed
            local.sock, local.watch, local.url, local.pid = sock, watch, url, pid
            local.fresh = True  # its first publish waits for the handshake's outcome
            local.sends = 0
            sock_ = sock
        return sock_

    def send(self, sock: zmq.Socket[Any], frames: list[bytes]) -> None:
        """Send on this thread's ``sock`` (from ``socket()``). Raises ``zmq.Again``
        when the collector's pipe stays full for ``SEND_TIMEOUT``, and
        ``HandshakeRefused`` when the broker refused the socket (closed then: the
        next publish tries a fresh one)."""
        local = self.local
        watch: HandshakeWatch = local.watch
        try:
            if not watch.send(sock, frames, int(SEND_TIMEOUT * 1000)):
                raise zmq.Again()
            local.sends += 1
            if local.fresh:
                local.fresh = False
                watch.wait_outcome(SEND_TIMEOUT)
            elif not local.sends % WATCH_EVERY:
                watch.check()
        except HandshakeRefused:
            self._forget(sock, watch, linger=0)  # refused: nothing it holds will go
            local.pid = None
            raise

    def send_confirmed(self, sock: zmq.Socket[Any], frames: list[bytes], events: int) -> None:
        """Send a confirmed publish batch of ``events`` (``frames[1]``: its id, set
        here) on this thread's ``sock``; wait for confirmations when too many are
        outstanding. Raises as ``send``, and ``PublishUnconfirmed``."""
        local = self.local
        unconfirmed: Unconfirmed = local.unconfirmed
        frames[1] = b"%d" % unconfirmed.sent(events)
        try:
            self.send(sock, frames)
        except BaseException:
            unconfirmed.unsent(events)
            raise
        if unconfirmed.full():
            unconfirmed.wait(sock, WINDOW_EVENTS // 2, _confirm_timeout())
        elif not local.sends % WATCH_EVERY:
            unconfirmed.read(sock)
            unconfirmed.raise_refused()

    def wait(self, timeout: float | None) -> None:
        """Wait until the broker has confirmed everything this thread published."""
        local = self.local
        sock = getattr(local, "sock", None)
        if getattr(local, "pid", None) != os.getpid() or sock is None or sock.closed:
            return
        unconfirmed: Unconfirmed = local.unconfirmed
        unconfirmed.wait(sock, 0, _confirm_timeout() if timeout is None else timeout)


def _confirm_timeout() -> float:
    try:
        return float(cached_settings().BUS_CONFIRM_TIMEOUT)
    except Exception:  # at exit the settings may be gone: the default
        return 30.0


def _confirm_at_exit(sock: zmq.Socket[Any], unconfirmed: Unconfirmed, timeout: float) -> None:
    """At exit: wait for what ``sock`` sent to be confirmed; say what was not."""
    if not unconfirmed.events and not unconfirmed.refused:
        return
    try:
        unconfirmed.wait(sock, 0, timeout)
    except PublishUnconfirmed as exc:
        log.error(
            "emq.publish: this process exits with %d events not confirmed by the broker "
            "(%s); they may be lost",
            exc.count,
            exc.reason,
        )
    except zmq.ZMQError as exc:
        log.error(
            "emq.publish: this process exits with %d events not confirmed by the broker "
            "(%s); they may be lost",
            unconfirmed.events,
            exc,
        )


_publisher = _Publisher()


def wait_published(timeout: float | None = None) -> None:
    """Wait until the broker has confirmed every event this thread published
    (numbered and in its journal). Raises ``PublishUnconfirmed`` with the count of
    events refused, or still unconfirmed after ``timeout`` seconds (default
    ``EMQ_BUS_CONFIRM_TIMEOUT``)."""
    _publisher.wait(timeout)


_collect_url: list[Any] = [None, ""]  # the settings object last read, and its collector URL
_producer: list[Any] = [0, ""]  # the pid the default producer id was made for, and the id


def _default_producer(pid: int) -> str:
    if _producer[0] != pid:
        _producer[0], _producer[1] = pid, f"emq-{pid}"
    name: str = _producer[1]
    return name


def new_uuid() -> bytes:
    """A random (version 4) UUID's 16 bytes, as ``uuid.uuid4().bytes`` gives them
    without making a UUID object."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    return bytes(raw)


def publish(
    topic: str,
    data: Any,
    *,
    content_type: str | None = None,
    producer: str | None = None,
    url: str | None = None,
    confirm: bool | None = None,
) -> str:
    """Publish one event; returns its UUID. Raises ``ValueError`` for a bad topic
    or data that cannot be encoded, ``zmq.Again`` when the collector's pipe stays
    full for 5 s, ``HandshakeRefused`` when the broker refuses this process's
    connection (its CURVE key, or none where CURVE is on), ``PublishUnconfirmed``
    when the broker refused events this thread published, or did not confirm them
    in time while ``WINDOW_EVENTS`` were outstanding. ``confirm`` (default
    ``EMQ_BUS_CONFIRM``, True): False sends the Event BUS document's plain PUB,
    which nothing answers, for a foreign Event BUS server (the released
    event-bus-zeromq knows no confirmed batch).

    Called once per event, so it keeps what does not change between calls: the
    collector's URL (read again when the settings object changes), the default
    producer id, the socket; the frames go in one call per frame to libzmq
    (``wire.send``) rather than through pyzmq's ``send_multipart``, and the UUID's
    text is made once for the frame and the return value."""
    check_topic(topic)
    payload, ctype = encode_data(data, content_type)
    raw_id = new_uuid()
    pid = os.getpid()
    producer_raw = (producer or _default_producer(pid)).encode()
    if url is None or confirm is None:
        settings = cached_settings()
        if _collect_url[0] is not settings:
            _collect_url[0], _collect_url[1] = settings, _url(settings, "COLLECT")
        url = url or _collect_url[1]
        confirm = settings.BUS_CONFIRM if confirm is None else confirm
    sock = _publisher.socket(url, pid)
    if not confirm:
        event_id = eventbus.encode_uuid(raw_id)
        ts = eventbus.encode_ts(time.time())
        _publisher.send(
            sock, eventbus.pub_frames(topic.encode(), producer_raw, ts, event_id, payload)
        )
        return event_id.decode()
    frames = eventbus.confirmed_pubs(
        0, topic.encode(), ctype, producer_raw, [time.time(), raw_id, payload]
    )
    _publisher.send_confirmed(sock, frames, 1)
    return eventbus.encode_uuid(raw_id).decode()


def publish_many(
    topic: str,
    items: Iterable[Any],
    *,
    content_type: str | None = None,
    producer: str | None = None,
    url: str | None = None,
) -> list[str]:
    """Publish several events on ``topic``, in order; returns their UUIDs. Each
    item is encoded as ``publish`` encodes its data. They go to the collector in
    emq's publish batches (``protocol/eventbus.py``), up to ``PUBLISH_BATCH``
    events or ``PUBLISH_BATCH_BYTES`` a message, so a burst costs one message per
    batch, not one per event; the broker numbers them one after the other, as
    many ``publish`` calls in a row, and confirm them as ``publish`` says. A bad
    topic or item raises before anything is sent."""
    check_topic(topic)
    encoded = [encode_data(item, content_type) for item in items]
    if not encoded:
        return []
    pid = os.getpid()
    if url is None:
        settings = cached_settings()
        if _collect_url[0] is not settings:
            _collect_url[0], _collect_url[1] = settings, _url(settings, "COLLECT")
        url = _collect_url[1]
    sock = _publisher.socket(url, pid)
    topic_raw = topic.encode()
    producer_raw = (producer or _default_producer(pid)).encode()
    ts = time.time()
    ids = os.urandom(16 * len(encoded))
    uuids = []
    flat: list[Any] = []
    size = 0
    ctype = encoded[0][1]
    for i, (payload, kind) in enumerate(encoded):
        if kind != ctype or size >= PUBLISH_BATCH_BYTES or len(flat) >= _BATCH_FIELDS_CAP:
            frames = eventbus.confirmed_pubs(0, topic_raw, ctype, producer_raw, flat)
            _publisher.send_confirmed(sock, frames, len(flat) // eventbus.PUBS_FIELDS)
            flat, size, ctype = [], 0, kind
        raw = bytearray(ids[16 * i : 16 * i + 16])  # version 4, as new_uuid
        raw[6] = (raw[6] & 0x0F) | 0x40
        raw[8] = (raw[8] & 0x3F) | 0x80
        event_id = bytes(raw)
        flat += (ts, event_id, payload)
        size += len(payload)
        uuids.append(event_id)
    frames = eventbus.confirmed_pubs(0, topic_raw, ctype, producer_raw, flat)
    _publisher.send_confirmed(sock, frames, len(flat) // eventbus.PUBS_FIELDS)
    return [eventbus.encode_uuid(u).decode() for u in uuids]


def publish_on_commit(topic: str, data: Any, *, using: str | None = None, **kw: Any) -> bool:
    """``publish`` when the transaction on ``using`` commits (now when none is
    open); returns True when it was deferred. The data is encoded now, so a bad
    topic or data raises here, not at commit time."""
    from emq_django.transaction import on_commit

    check_topic(topic)
    encode_data(data, kw.get("content_type"))
    return on_commit(lambda: publish(topic, data, **kw), using)


# ---- subscribing: the Clone pattern's client, without sockets ------------------------------


class Expired:
    """In a subscriber's queue: events ``first`` .. ``last`` expired before it
    read them (``EventsExpired`` is raised when it comes to the front)."""

    __slots__ = ("first", "last")

    def __init__(self, first: int, last: int) -> None:
        self.first = first
        self.last = last

    def error(self) -> EventsExpired:
        return EventsExpired(self.first, self.last)


class CloneState:
    """What a subscriber knows: ``last``, the sequence up to which it has every
    event under its prefixes. Fed the frames of the SUB and snapshot sockets, it
    returns the events to yield and says when to ask the snapshot."""

    def __init__(self, prefixes: Sequence[str], since: int | None) -> None:
        self.prefixes = tuple(prefixes)
        self.last = since if since is not None else -1  # -1: ask for the current one
        self.syncing_since: float | None = None  # when the outstanding SYNCSTART left
        self.started = False  # the first SYNCSTART went out
        self.answer_syncs = 0  # SYNCs in the answer being read
        self.more = False  # the last answer may have been a page: ask again
        self.buffer: list[Event] = []
        self.gaps = 0  # jumps in the live sequence filled from the snapshot
        self.syncs = 0
        self.dropped = 0  # malformed messages
        self.live_seen = 0  # events under the prefixes that came on the SUB socket
        self.from_snapshot = 0  # events yielded from the snapshot
        self.expired = 0  # sequence numbers told expired (not all on our topics)

    def syncstart(self, now: float) -> list[bytes]:
        self.started = True
        self.more = False
        self.answer_syncs = 0
        self.syncing_since = now
        self.syncs += 1
        return eventbus.syncstart(self.prefixes, LATEST if self.last < 0 else self.last)

    def needs_sync(self, now: float, idle: float, idle_check: float) -> bool:
        if self.syncing_since is not None:
            return now - self.syncing_since >= SYNC_TIMEOUT  # lost (a broker restart)
        return not self.started or self.more or idle >= idle_check

    def on_live(self, frames: Sequence[bytes]) -> list[Event]:
        """A BROADCAST from the Event BUS publisher."""
        event = self._decode(eventbus.decode_event, frames)
        if not isinstance(event, Event) or not matches(event.topic, self.prefixes):
            return []
        self.live_seen += 1
        return self._live(event)

    def on_live_batch(self, frames: Sequence[bytes]) -> list[Received]:
        """A delivery batch from the batch publisher: consecutive events on one
        topic, handled as that many BROADCASTs; the events to yield, already as
        ``Received``. When they follow on from ``last`` (the usual case) they are
        made straight from the batch's fields, without an ``Event`` each."""
        batch = self._decode(eventbus.decode_batch_fields, frames)
        if batch is None:
            return []
        topic, flat = batch
        if not flat or not matches(topic, self.prefixes):
            return []
        n = len(flat) // eventbus.BATCH_FIELDS
        self.live_seen += n
        last = self.last
        if last >= 0 and flat[0] == last + 1:  # follows on (as ``_live``: even mid-sync)
            try:
                out = _follow_on(topic, flat, last)
            except (TypeError, ValueError):
                out = None  # not in order, or a field of the wrong type: the long way
            if out is not None:
                self.last = last + n
                return out
        events = self._decode(eventbus.decode_batch, frames)
        if not events:
            return []
        kept = []
        gaps = self.gaps
        for event in events:
            kept += self._live(event)
        self.gaps = min(self.gaps, gaps + 1)  # one jump, however many events follow it
        return [received(e) for e in kept]

    def _live(self, event: Event) -> list[Event]:
        last = self.last
        if last >= 0 and event.seq == last + 1:
            # follows on: yielded at once, even while a snapshot answer is awaited
            # (the answer's copy is then skipped, as at or below ``last``). Holding
            # it until the SYNCEND delayed every event by the answer's round trip
            # whenever a subscriber asked (an idle check after its process had
            # waited a second for a CPU): 1-2 s at load 20, a bench round's p99
            self.last = event.seq
            return [event]
        if self.syncing_since is not None or last < 0:
            if len(self.buffer) < MAX_BUFFERED:  # past it: the snapshot fills them in
                self.buffer.append(event)
            return []
        if event.seq <= last:
            return []
        self.gaps += 1
        self.buffer.append(event)
        return []  # the caller asks the snapshot (``wants_fill``)

    @property
    def wants_fill(self) -> bool:
        return self.syncing_since is None and bool(self.buffer)

    def on_snapshot(self, frames: Sequence[bytes]) -> list[Event | Expired]:
        item = self._decode(eventbus.decode_snapshot, frames)
        if isinstance(item, Event):
            if self.syncing_since is not None:
                self.syncing_since = time.monotonic()  # the answer is coming
                self.answer_syncs += 1
            if item.seq > self.last and self.last >= 0 and matches(item.topic, self.prefixes):
                self.last = item.seq
                self.from_snapshot += 1
                return [item]
            return []
        if item is None:
            return []
        if isinstance(item, tuple):  # SYNCEXPIRED: events it asked for are gone
            first, last = item
            if last <= self.last:
                return []  # an older request's: nothing it still needs
            gone = Expired(max(first, self.last + 1), last)
            self.last = last
            self.expired += last - gone.first + 1
            return [gone]
        # a SYNCEND below ``last`` is the answer to an older request (one asked
        # again after SYNC_TIMEOUT): it covers nothing new. (A broker whose event
        # store was started anew is not followed down: its events are skipped
        # until its sequence passes ``last``.)
        self.last = max(self.last, item)
        self.syncing_since = None
        self.more = self.answer_syncs >= PAGE_HINT
        return list(self._drain_buffer())

    def _drain_buffer(self) -> list[Event]:
        """Live events held back: those above ``last`` in order while they follow
        on; at the first jump, keep the rest and ask the snapshot again."""
        held, self.buffer = sorted(self.buffer, key=lambda e: e.seq), []
        out = []
        for i, event in enumerate(held):
            if event.seq <= self.last:
                continue
            if event.seq != self.last + 1:
                self.buffer = held[i:]
                break
            self.last = event.seq
            out.append(event)
        return out

    def _decode(self, decode: Any, frames: Sequence[bytes]) -> Any:
        try:
            return decode(frames)
        except ProtocolError as exc:
            self.dropped += 1
            log.warning("dropped a malformed Event BUS message: %s", exc)
            return None


def _follow_on(topic: str, flat: list[Any], last: int) -> list[Received] | None:
    """The events of a batch's fields as ``Received``, if their sequence numbers
    are ``last + 1, last + 2, ...``; else None."""
    out = []
    unpack = _unpackb
    it = iter(flat)
    expect = last + 1
    for seq, producer, ts, uuid, raw in zip(it, it, it, it, it, strict=True):
        if seq != expect or type(raw) is not bytes or type(producer) is not str:
            return None
        expect += 1
        try:
            data = unpack(raw, raw=False, strict_map_key=False)
        except (ValueError, msgpack.UnpackException):
            data = raw  # not MessagePack: as it came
        out.append(Received(seq, topic, data, producer, uuid, float(ts), raw))
    return out


def _yielded(item: Event | Expired) -> Received | Expired:
    return item if type(item) is Expired else received(item)  # type: ignore[arg-type]


def received(event: Event) -> Received:
    try:
        data = _unpackb(event.data, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException, TypeError):
        data = event.data  # not MessagePack: as it came
    return Received(event.seq, event.topic, data, event.producer, event.uuid, event.ts, event.data)


_unpackb = msgpack.unpackb


class Subscription:
    """``for event in emq.subscribe(...)``: blocks for the next event; ``close()``
    (or leaving a ``with`` block) ends it. ``last`` is the sequence to resume from."""

    def __init__(
        self,
        prefixes: Sequence[str],
        since: int | None = None,
        *,
        snapshot_url: str | None = None,
        publish_url: str | None = None,
        batch_url: str | None = None,
        idle_check: float = 1.0,
        rcvhwm: int | None = None,
        rcvbuf: int | None = None,
        context: zmq.Context[Any] | None = None,
        curve: CurveKeys | None | str = FROM_SETTINGS,
    ) -> None:
        """``curve``: CURVE keys, by default this process's (``EMQ_CURVE_*``); a
        broker refusing them makes ``next()`` raise ``HandshakeRefused``.
        ``rcvhwm``, ``rcvbuf``: the SUB socket's queue (messages) and kernel buffer
        (bytes); past them a slow subscriber misses live events and fills them in
        from the snapshot. Live events come from the broker's batch publisher
        (``batch_url``, else ``EMQ_BUS_BATCH_URL`` or ``EMQ_BUS_BATCH_BIND`` when
        no ``publish_url`` is given) when there is one, else from the Event BUS
        publisher (``publish_url``, else ``EMQ_BUS_PUBLISH_URL`` or ``_BIND``)."""
        settings = cached_settings()
        self.state = CloneState(prefixes, since)
        self.idle_check = idle_check
        live_url, batched = _live_url(settings, publish_url, batch_url)
        self._on_live = self.state.on_live_batch if batched else self._on_broadcast
        ctx = context or zmq.Context.instance()
        keys = resolve(curve)
        self.sub, sub_watch = _open_sub(ctx, live_url, self.state.prefixes, keys, rcvhwm, rcvbuf)
        try:
            self.snapshot, snap_watch = transport.connect_watched(
                ctx,
                zmq.DEALER,
                snapshot_url or _url(settings, "SNAPSHOT"),
                SocketOptions(curve=keys, identity=snapshot_identity()),
            )
        except BaseException:
            sub_watch.close()  # (first: HandshakeWatch.close)
            self.sub.close()
            raise
        self.watches = {sub_watch.pair: sub_watch, snap_watch.pair: snap_watch}
        self.poller = zmq.Poller()
        self.poller.register(self.sub, zmq.POLLIN)
        self.poller.register(self.snapshot, zmq.POLLIN)
        for pair in self.watches:
            self.poller.register(pair, zmq.POLLIN)
        self._ready: deque[Received | Expired] = deque()
        self._rcvtimeo = -1  # the SUB socket's receive timeout now (ms; see _wait_live)
        self._heard = time.monotonic()
        # the first snapshot request leaves now: with since=None, "live" means the
        # events the broker numbers after it answers this request
        _ask_snapshot(self.snapshot, self.state.syncstart(self._heard))

    @property
    def last(self) -> int:
        return self.state.last

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for watch in self.watches.values():  # first: HandshakeWatch.close
            watch.close()
        self.sub.close()
        self.snapshot.close()

    def __iter__(self) -> Iterator[Received]:
        while True:
            event = self.next(timeout=None)
            if event is not None:
                yield event

    def next(self, timeout: float | None = None) -> Received | None:
        """The next event, or None after ``timeout`` seconds (None: wait for ever).
        Raises ``EventsExpired`` where events it needed had expired (the next call
        goes on after them)."""
        if self._ready:
            return self._pop()
        deadline = None if timeout is None else time.monotonic() + timeout
        state = self.state
        while not self._ready:
            now = time.monotonic()
            if state.needs_sync(now, now - self._heard, self.idle_check) or state.wants_fill:
                if self._only_idle() and _get(self.sub, _EVENTS) & _POLLIN:
                    # not idle: events wait to be read (this process waited for a
                    # CPU); read them rather than ask the snapshot
                    self._heard = now
                else:
                    _ask_snapshot(self.snapshot, state.syncstart(now))
                    self._heard = now
            if deadline is not None and now >= deadline:
                return None
            wait = self.idle_check if deadline is None else min(self.idle_check, deadline - now)
            ms = int(max(wait, 0.0) * 1000) + 1
            if state.syncing_since is None:
                self._wait_live(ms)
                continue
            for sock, _ in self.poller.poll(ms):
                watch = self.watches.get(sock)
                if watch is not None:
                    watch.check()  # raises HandshakeRefused when the broker refused us
                    continue
                self._heard = time.monotonic()
                on = self._on_live if sock is self.sub else self._on_snapshot
                # read until EAGAIN: asking ZMQ_EVENTS before each message costs
                # more than the one failed recv at the end
                while True:
                    try:
                        frames = wire.recv(sock)
                    except zmq.Again:
                        break
                    self._ready += on(frames)
        return self._pop()

    def _pop(self) -> Received:
        item = self._ready.popleft()
        if type(item) is Expired:
            raise item.error()
        return item  # type: ignore[return-value]

    def _only_idle(self) -> bool:
        """A snapshot request is due only because nothing was heard for
        ``idle_check`` (not a first request, a lost one, a page or a gap)."""
        state = self.state
        return state.started and state.syncing_since is None and not state.more and not state.buffer

    def _wait_live(self, ms: int) -> None:
        """No snapshot answer is awaited: wait in a receive on the SUB socket alone,
        up to ``ms``, then take what else is there. At 1,000 events/s every event
        is a wake-up of its own, and a blocking receive costs about half the
        system calls of ``zmq_poll`` of two sockets (which asks each socket for
        ZMQ_EVENTS before and after it sleeps). An answer to an older snapshot
        request (asked again after SYNC_TIMEOUT) waits on the snapshot socket
        until the next request: one below ``last`` covers nothing new anyway."""
        sub = self.sub
        if self._rcvtimeo != ms:
            sub.rcvtimeo = self._rcvtimeo = ms
        try:
            frames = wire.recv(sub, nonblocking=False)
        except zmq.Again:  # the time is up: has the broker refused us meanwhile?
            for watch in self.watches.values():
                watch.check()  # raises HandshakeRefused
            return
        self._heard = time.monotonic()
        ready = self._ready
        on = self._on_live
        ready += on(frames)
        # one message is the usual case at a steady rate: ask once rather than
        # fail a receive (a Python exception); in a burst read until EAGAIN
        if _get(sub, _EVENTS) & _POLLIN:
            while True:
                try:
                    frames = wire.recv(sub)
                except zmq.Again:
                    break
                ready += on(frames)

    def _on_snapshot(self, frames: Sequence[bytes]) -> list[Received | Expired]:
        return [_yielded(e) for e in self.state.on_snapshot(frames)]

    def _on_broadcast(self, frames: Sequence[bytes]) -> list[Received]:
        return [received(e) for e in self.state.on_live(frames)]


def snapshot_identity() -> bytes:
    """A UTF-8 identity for a subscription's snapshot DEALER: the released Event BUS
    (Node) turns the identity into a string and routes its SYNCs back by it, so
    libzmq's automatic binary identity never got an answer."""
    return f"emq-sub-{os.getpid()}-{os.urandom(8).hex()}".encode()


def _ask_snapshot(snapshot: zmq.Socket[Any], frames: list[bytes]) -> None:
    """Send a snapshot request without ever blocking. A DEALER whose handshake the
    broker refused has no pipe left (libzmq does not connect again), and a blocking
    send on it waited for ever: under load the refusal came before the first
    request, and ``subscribe()`` hung instead of raising. A request that cannot
    leave now is asked again after ``SYNC_TIMEOUT``; a refusal is raised by the
    socket's watch, which the reader polls (``HandshakeRefused``)."""
    try:
        wire.send(snapshot, frames)
    except zmq.Again:
        pass


def _open_sub(
    ctx: zmq.Context[Any],
    url: str,
    prefixes: Sequence[str],
    keys: CurveKeys | None,
    rcvhwm: int | None = None,
    rcvbuf: int | None = None,
) -> tuple[zmq.Socket[Any], HandshakeWatch]:
    """A SUB socket to ``url`` subscribed to ``prefixes`` (all: none given), watched."""
    sub = transport.make_socket(ctx, zmq.SUB, SocketOptions(rcvhwm=rcvhwm, curve=keys))
    if rcvbuf is not None:
        sub.rcvbuf = rcvbuf
    for prefix in prefixes or ("",):
        sub.setsockopt(zmq.SUBSCRIBE, prefix.encode())
    try:
        watch = HandshakeWatch(sub, url, keys)
        sub.connect(url)
    except zmq.ZMQError:
        sub.close(linger=0)
        raise
    return sub, watch


def subscribe(
    prefixes: str | Sequence[str] = "", since: int | None = None, **kw: Any
) -> Subscription:
    """Events under ``prefixes`` (a prefix or several; ``""``: all): those above
    ``since`` that the broker keeps, then live ones; ``since=None``: live ones only,
    those numbered after the broker answers the subscription's first snapshot
    request (sent at once; pass a sequence number to be sure of where it starts)."""
    return Subscription([prefixes] if isinstance(prefixes, str) else list(prefixes), since, **kw)


async def asubscribe(
    prefixes: str | Sequence[str] = "",
    since: int | None = None,
    *,
    snapshot_url: str | None = None,
    publish_url: str | None = None,
    batch_url: str | None = None,
    idle_check: float = 1.0,
    curve: CurveKeys | None | str = FROM_SETTINGS,
) -> AsyncIterator[Received]:
    """``subscribe`` for asyncio: ``async for event in emq.asubscribe(...)``. Raises
    ``EventsExpired`` where events it needed had expired, which ends the iteration:
    subscribe again with ``since=exc.last`` to go on after them."""
    settings = cached_settings()
    state = CloneState([prefixes] if isinstance(prefixes, str) else list(prefixes), since)
    ctx = zmq.asyncio.Context.instance()
    keys = resolve(curve)
    live_url, batched = _live_url(settings, publish_url, batch_url)
    sub, sub_watch = _open_sub(ctx, live_url, state.prefixes, keys)
    snapshot: Any  # an asyncio socket (its context's)
    try:
        snapshot, snap_watch = transport.connect_watched(
            ctx,
            zmq.DEALER,
            snapshot_url or _url(settings, "SNAPSHOT"),
            SocketOptions(curve=keys, identity=snapshot_identity()),
        )
    except BaseException:
        sub_watch.close()  # (first: HandshakeWatch.close)
        sub.close()
        raise
    watches = {sub_watch.pair: sub_watch, snap_watch.pair: snap_watch}
    try:

        def on_broadcast(frames: Sequence[bytes]) -> list[Received]:
            return [received(e) for e in state.on_live(frames)]

        on_live = state.on_live_batch if batched else on_broadcast
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(snapshot, zmq.POLLIN)
        for pair in watches:
            poller.register(pair, zmq.POLLIN)
        heard = time.monotonic()
        while True:
            now = time.monotonic()
            if state.needs_sync(now, now - heard, idle_check) or state.wants_fill:
                _ask_snapshot(snapshot, state.syncstart(now))
                heard = now
            for sock, _ in await poller.poll(idle_check * 1000):
                watch = watches.get(sock)
                if watch is not None:
                    watch.check()  # raises HandshakeRefused when the broker refused us
                    continue
                heard = time.monotonic()
                frames = await sock.recv_multipart()
                if sock is sub:
                    for event in on_live(frames):
                        yield event
                else:
                    for item in state.on_snapshot(frames):
                        if type(item) is Expired:
                            raise item.error()
                        yield received(item)  # type: ignore[arg-type]
    finally:
        for watch in watches.values():  # first: HandshakeWatch.close
            watch.close()
        sub.close()
        snapshot.close()
