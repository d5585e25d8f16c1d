"""A client's state: every attribute the connection, the inbox and the sender
share, made in one place.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from typing import TYPE_CHECKING, Any

import zmq

from emq_django import transport
from emq_django.client.lifetime import _clients
from emq_django.ids import IdGenerator
from emq_django.protocol import batch as B
from emq_django.protocol import frames as F
from emq_django.security.keys import FROM_SETTINGS, CurveKeys
from emq_django.transport import HandshakeWatch

# (sending.py's, here for the size of the refusals' memory)
COALESCE_JOBS = 256
_MARK = B.MARK


class ClientState:
    """The attributes of ``Client`` (core.py), which its layers share."""

    # job managers may record its jobs' results in the job history (emq_django.results),
    # where ``get()`` also looks; not so for the in-memory broker's (emq_django.testing)
    records_history = True

    def __init__(
        self,
        url: str,
        *,
        ack_timeout: float = 5.0,
        window: int = 1000,
        context: zmq.Context[Any] | None = None,
        curve: CurveKeys | None | str = FROM_SETTINGS,
    ) -> None:
        self.url = url
        self.curve = curve  # CURVE keys; FROM_SETTINGS: EMQ_CURVE_* (security/keys.py)
        self.ack_timeout = ack_timeout
        self.window = window
        self._context = context
        self._sock: zmq.Socket[Any] | None = None
        # the socket's handshakes: a broker refusing this process's key (or its lack
        # of one) is reported at once, as ``HandshakeRefused``, not after ack_timeout
        self._watch: HandshakeWatch | None = None
        self._lock = threading.RLock()
        # msgid -> sent at, oldest first. A dict: an OrderedDict's insert and pop cost
        # half as much again, once each per job (its first entry is found as fast)
        self._pending: dict[bytes, float] = {}
        self._replies: OrderedDict[bytes, F.Reply] = OrderedDict()
        self._errors: OrderedDict[bytes, F.Error] = OrderedDict()
        self._partials: OrderedDict[bytes, Any] = OrderedDict()
        self._partials_evicted: OrderedDict[bytes, None] = OrderedDict()  # over the bounds
        self._answered: list[bytes] | None = None  # ACKed/refused msgids, while a batch waits
        self._confirmed = False
        self._ids = IdGenerator()
        self._drain_at = 0  # read the ACKs waiting once _unacked() reaches this
        # a REQUEST's headers -> the same with the ``acks`` flag: this client reads an
        # ACK naming several msgids, so our broker sends one per turn, not one per job
        self._flagged: dict[bytes, bytes] = {}
        # REQUESTS: the broker's ACKs said it reads them (``MARK``); the jobs waiting
        # to go as one (records: protocol/batch.py), how many, their bodies' bytes
        # and when the first came; the thread that sends them after COALESCE_WAIT
        self._coalesce = False
        self._buf: list[bytes] = []
        self._buf_jobs = 0
        self._buf_bytes = 0
        self._buf_since = 0.0
        self._last_send = 0.0  # when a send last went at once, or a buffer left
        # REQUESTS sent and not yet acknowledged, oldest first: (their msgids joined
        # by LF, how many, when the first was buffered), and how many jobs in all.
        # Not one _pending entry per job: our broker ACKs a turn's jobs in one frame,
        # the same bytes as the messages' msgids joined, so that a whole message is
        # acknowledged by comparing bytes. Any other ACK (a part of a message, one
        # frame each, a refusal) first moves them into _pending (_settle).
        self._sent: deque[tuple[bytes, int, float]] = deque()
        self._sent_jobs = 0
        self._flusher: Any = None
        # the last jobs sent without reply and without waiting for their ACK: a
        # refused job is always among the last ``window`` sent (a refusal is looked
        # up here, which costs a scan of it: refusals are rare; the send costs an
        # append); their refusals, raised by the next call (JobsRefused)
        self._noreply: deque[bytes] = deque(maxlen=2 * window + COALESCE_JOBS)
        self._refused: list[tuple[str, str, str]] = []
        self._refused_count = 0
        # the broker's incarnation (a fresh one each time it starts), asked on each new
        # connection; ``broker_changes`` counts the times it changed: a plain job sent
        # before a change, and acknowledged by then, is lost (JobLost)
        self.broker_changes = 0
        self._incarnation = b""
        # how its ACKs' msgids start: MARK and the incarnation (none known yet: no match)
        self._ack_head = _MARK + b"?"
        self._handshakes = 0
        self._unacked_at_change: frozenset[bytes] = frozenset()
        # failover (``url`` lists several brokers, transport.addresses): the socket
        # connects to each, and only the active one binds. ``_connected`` counts
        # the connections made (a new one: perhaps another broker), which the waits
        # for an ACK watch to send their guaranteed jobs again at once
        self._failover = transport.is_failover(url)
        self._connected = 0
        self._disconnects = 0  # the connections dropped that were seen (the watch's count)
        self._claims_sent = False  # replies claimed at a change, not since a drop
        # the guaranteed jobs with a reply that the broker acknowledged and that
        # have no REPLY yet: msgid -> their REQUEST's frames. A broker that replaced
        # the one that took them (restarted, or a standby taking over) restored them
        # from its journal without knowing who waits: each is sent again under its
        # id, which the broker takes as "this client waits" (not as a new job)
        self._awaiting: OrderedDict[bytes, list[bytes]] = OrderedDict()
        # the batch (batches.py's _Batch) that send_batch() is sending, if any
        self._batch: Any = None
        # msgids a wait for an ACK sends again itself (guaranteed; batches)
        self._resending: set[bytes] = set()
        # plain jobs sent to a broker that was replaced before it acknowledged them
        # (failover): at most once, never sent again; their get() raises JobLost
        self._lost: OrderedDict[bytes, None] = OrderedDict()
        _clients.add(self)

    # ---- sending ------------------------------------------------------------

    def new_id(self) -> str:
        with self._lock:
            return self._ids.text()

    if TYPE_CHECKING:  # defined by the layers above (sending.py)

        def _flush_buffer(self) -> None: ...

        def _unacked(self) -> int:
            raise NotImplementedError
