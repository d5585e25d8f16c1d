"""Publishing: ``publish()``, ``publish_many()`` and ``publish_on_commit()``,
pipelined, with the broker's confirmations counted per thread
(``publish_confirm.py``) and waited for by ``wait_published()`` and at exit.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from emq_django import transport
from emq_django.conf import cached_settings
from emq_django.exceptions import (
    HandshakeRefused,
    PublishUnconfirmed,
)
from emq_django.protocol import eventbus
from emq_django.protocol.events import JSON, MSGPACK, OCTETS, check_topic
from emq_django.publish_confirm import WINDOW_EVENTS, Unconfirmed
from emq_django.pubsub.addresses import _url
from emq_django.security.keys import FROM_SETTINGS, resolve
from emq_django.transport import HandshakeWatch, SocketOptions

log = logging.getLogger(__name__)

PUBLISH_BATCH = 256  # events in one publish batch (publish_many)
PUBLISH_BATCH_BYTES = 256 * 1024  # data bytes in one (it may pass it by one event)
_BATCH_FIELDS_CAP = PUBLISH_BATCH * eventbus.PUBS_FIELDS
SEND_TIMEOUT = 5.0  # seconds a publish waits for room in the collector's pipe
# a publisher reads its handshake events every this many sends (and whenever the
# pipe is full): a refusal after a reconnect is reported, without a getsockopt
# (about as dear as sending a frame) on every publish
WATCH_EVERY = 256


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
