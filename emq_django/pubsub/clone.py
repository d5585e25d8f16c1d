"""The subscriber's Clone-pattern state, without sockets: live events in
sequence, gaps filled from the snapshot, expired events said.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import msgpack

from emq_django.exceptions import (
    EventsExpired,
    ProtocolError,
)
from emq_django.protocol import eventbus
from emq_django.protocol.events import Event, matches
from emq_django.pubsub.received import Received, _unpackb, received

log = logging.getLogger(__name__)

SYNC_TIMEOUT = 5.0  # seconds without a SYNCEND before asking again (a restarted broker)
MAX_BUFFERED = 100_000  # live events held while a snapshot is asked for; then dropped
LATEST = 2**62  # SYNCSTART above every event: only the current sequence comes back
# after an answer with this many SYNCs (a long replay, during which live events
# may have been dropped), ask again at once rather than after idle_check
PAGE_HINT = 1000


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
