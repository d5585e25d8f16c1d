"""The broker's topic space: events numbered by one sequence and kept for replay.

Every event published on any port (Event BUS, mc0, ``emq.publish``) gets the next
number of one strictly increasing sequence (``TopicSpace.last_seq``) and is kept,
so a subscriber that was away asks for what it missed (``since``) and a new one
for the latest events of a topic (``latest``). Where they are kept:

- with the journal (``EMQ_JOURNAL_PATH``), in its SQLite file (table ``events``):
  the core queues an ``("event", ...)`` operation with the turn's journal
  operations, so the events of a loop turn are written in the same transaction as
  its jobs, before anything about them leaves the broker. After a restart the
  sequence goes on from the highest number ever given (``topic_meta`` keeps it
  when retention has deleted the newest events);
- without one, in memory, bounded by the retention rules and ``MEMORY_CAP``.

Retention (``EMQ_TOPIC_RETENTION``): rules by topic prefix, the longest matching
prefix wins; each rule keeps events at most ``max_age`` seconds old and at most
``max_count`` of them (counted over all the topics the rule covers).
"""

from __future__ import annotations

import bisect
import heapq
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from emq_django.protocol.events import (
    DEFAULT_RETENTION,
    JSON,
    MAX_TOPIC_BYTES,
    MSGPACK,
    OCTETS,
    Event,
    Rule,
    check_topic,
    matches,
    parse_retention,
)

# the values live in protocol/events.py; importable from here as they were
__all__ = [
    "DEFAULT_RETENTION",
    "JSON",
    "MAX_TOPIC_BYTES",
    "MSGPACK",
    "OCTETS",
    "Event",
    "EventStore",
    "OpsSink",
    "Rule",
    "TopicSpace",
    "check_topic",
    "matches",
    "parse_retention",
]

MEMORY_CAP = 1_000_000  # events kept in memory over all rules (no journal)
RATE_WINDOW = 10.0  # seconds over which events/s is measured
MAX_TRACKED_TOPICS = 10_000  # topics with figures of their own; the rest count as "(other)"
OTHER = "(other)"


class OpsSink(Protocol):
    """Where journal operations wait for the turn's commit (the job lifecycle)."""

    journal_ops: list[Any] | None  # None: no journal

    def journal_event(self, event: Event, rule: str) -> None:
        """Save ``event``, filed under the retention rule ``rule``."""

    def journal_prune_events(self, rules: Any, wall: float, last_seq: int) -> None:
        """Apply the retention ``rules`` at ``wall``."""


class EventStore(Protocol):
    """What the topic space reads from the durable store (the journal)."""

    def topic_state(self) -> tuple[int, dict[str, tuple[int, int]]]: ...

    def events_since(
        self, prefixes: Sequence[str], seq: int, upto: int, limit: int
    ) -> list[Event]: ...

    def latest_events(self, topic: str, n: int) -> list[Event]: ...

    def expired_upto(self) -> dict[str, int]: ...


@dataclass(slots=True)
class TopicFigures:
    last_seq: int = 0
    published: int = 0  # since the broker started
    last_ts: float = 0.0
    window: deque[float] = field(default_factory=deque)  # wall times within RATE_WINDOW

    def rate(self, wall: float) -> float:
        window = self.window
        while window and window[0] < wall - RATE_WINDOW:
            window.popleft()
        return round(len(window) / RATE_WINDOW, 3)


class Kept:
    """One rule's events in memory, in sequence order: a list and the index of its
    first kept event, so a replay finds where to start by bisection and reads
    from there (a deque's indexing walks its blocks: a page read from the middle
    of a million events cost milliseconds)."""

    __slots__ = ("events", "head")

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.head = 0

    def __len__(self) -> int:
        return len(self.events) - self.head

    def __bool__(self) -> bool:
        return len(self.events) > self.head

    def append(self, event: Event) -> None:
        self.events.append(event)

    def first(self) -> Event:
        return self.events[self.head]

    def popleft(self) -> Event:
        event = self.events[self.head]
        self.head += 1
        if self.head >= 4096 and self.head * 2 >= len(self.events):
            del self.events[: self.head]  # amortised: at most once per half
            self.head = 0
        return event

    def after(self, seq: int) -> Iterator[Event]:
        """The kept events above ``seq``, in order."""
        events = self.events
        start = bisect.bisect_right(events, seq, lo=self.head, key=_seq_of)
        return map(events.__getitem__, range(start, len(events)))

    def newest_first(self) -> Iterator[Event]:
        events = self.events
        return map(events.__getitem__, range(len(events) - 1, self.head - 1, -1))


def _seq_of(event: Event) -> int:
    return event.seq


class TopicSpace:
    """Numbers events, keeps them (in memory or through the journal) and answers
    replays. The core owns one; ``attach`` joins it to the journal at start-up."""

    def __init__(self, retention: Mapping[str, Any] | str | None = None) -> None:
        self.rules = parse_retention(retention)
        self.last_seq = 0
        self.store: EventStore | None = None
        self.sink: OpsSink | None = None  # with a journal: where "event" ops wait
        self.unsaved: list[Event] = []  # queued for the journal, not committed yet
        self.unsaved_bytes = 0  # their data
        self.figures: dict[str, TopicFigures] = {}
        self.published = 0
        self.lost = 0  # events whose journal write failed
        # in memory (no journal): one deque per rule, in sequence order
        self._kept: dict[str, Kept] = {r.prefix: Kept() for r in self.rules}
        # in memory: per rule, the highest event number retention removed
        self._expired: dict[str, int] = {}

    # ---- start-up -------------------------------------------------------------------

    def attach(self, store: EventStore, sink: OpsSink) -> None:
        """Keep events in ``store`` from now on, through operations queued in
        ``sink.journal_ops``, and go on with the sequence (and each topic's
        figures) from what it holds."""
        self.store = store
        self.sink = sink
        last, topics = store.topic_state()
        self.last_seq = max(self.last_seq, last)
        for topic, (seq, _count) in topics.items():
            self._figures(topic).last_seq = seq

    def rule_for(self, topic: str) -> Rule:
        for rule in self.rules:  # longest prefix first
            if topic.startswith(rule.prefix):
                return rule
        return self.rules[-1]  # pragma: no cover - "" is always there

    # ---- writing --------------------------------------------------------------------

    def add(
        self,
        topic: str,
        data: bytes,
        producer: str,
        content_type: str,
        headers: tuple[tuple[str, str], ...],
        uuid: bytes,
        ts: float,
        wall: float,
    ) -> Event:
        """Number and keep one event (the caller checked the topic); ``ts`` is the
        producer's time, ``wall`` the broker's."""
        self.last_seq += 1
        event = Event(self.last_seq, topic, data, producer, uuid, ts, content_type, headers)
        rule = self.rule_for(topic)
        sink = self.sink
        if sink is not None and sink.journal_ops is not None:
            sink.journal_event(event, rule.prefix)
            self.unsaved.append(event)
            self.unsaved_bytes += len(data)
        else:
            kept = self._kept[rule.prefix]
            kept.append(event)
            if rule.max_count and len(kept) > rule.max_count:
                self._expire(rule.prefix, kept.popleft())
            self._cap_memory()
        figures = self._figures(topic)
        figures.last_seq = event.seq
        figures.published += 1
        figures.last_ts = ts
        figures.window.append(wall)
        if len(figures.window) > 100_000:
            figures.window.popleft()
        self.published += 1
        return event

    def saved(self) -> None:
        """The journal committed the events queued so far."""
        self.unsaved.clear()
        self.unsaved_bytes = 0

    def lose_unsaved(self) -> list[Event]:
        """The journal could not write the queued events: they are gone."""
        lost, self.unsaved = self.unsaved, []
        self.unsaved_bytes = 0
        self.lost += len(lost)
        return lost

    def _cap_memory(self) -> None:
        total = sum(len(k) for k in self._kept.values())
        while total > MEMORY_CAP:
            prefix, oldest = min(
                ((p, k) for p, k in self._kept.items() if k), key=lambda pk: pk[1].first().seq
            )
            self._expire(prefix, oldest.popleft())
            total -= 1

    def _figures(self, topic: str) -> TopicFigures:
        figures = self.figures.get(topic)
        if figures is None:
            if len(self.figures) >= MAX_TRACKED_TOPICS:
                topic = OTHER
                figures = self.figures.get(topic)
            if figures is None:
                figures = self.figures[topic] = TopicFigures()
        return figures

    # ---- retention ------------------------------------------------------------------

    def prune(self, wall: float) -> None:
        """Apply the retention rules (the core calls this every few seconds)."""
        sink = self.sink
        if sink is not None and sink.journal_ops is not None:
            sink.journal_prune_events(self.rules, wall, self.last_seq)
            return
        for rule in self.rules:
            kept = self._kept[rule.prefix]
            if rule.max_age:
                cutoff = wall - rule.max_age
                while kept and kept.first().ts < cutoff:
                    self._expire(rule.prefix, kept.popleft())
            while rule.max_count and len(kept) > rule.max_count:
                self._expire(rule.prefix, kept.popleft())

    def _expire(self, prefix: str, event: Event) -> None:
        if event.seq > self._expired.get(prefix, 0):
            self._expired[prefix] = event.seq

    def expired_above(self, prefixes: Sequence[str], seq: int) -> int:
        """The highest event number retention removed from a rule that covers topics
        under ``prefixes`` (none: all), when it is above ``seq``; else 0. Events of
        such a rule numbered up to it are gone: a subscriber asking from ``seq``
        may have missed some (the rule may also cover other topics)."""
        expired = self.store.expired_upto() if self.store is not None else self._expired
        if not expired:
            return 0
        top = max((expired.get(r.prefix, 0) for r in self._rules_under(prefixes)), default=0)
        return top if top > seq else 0

    def _rules_under(self, prefixes: Sequence[str]) -> list[Rule]:
        """The rules that cover a topic under one of ``prefixes``: the rule each
        prefix falls under, and the rules of longer prefixes within it."""
        prefixes = [p for p in prefixes if p]
        if not prefixes:
            return list(self.rules)
        found = {self.rule_for(p) for p in prefixes}
        found.update(r for r in self.rules if any(r.prefix.startswith(p) for p in prefixes))
        return list(found)

    # ---- reading --------------------------------------------------------------------

    def since(self, prefixes: Sequence[str], seq: int, limit: int = 0) -> Iterator[Event]:
        """The kept events above ``seq`` on topics under ``prefixes``, in order
        (at most ``limit`` when it is not 0)."""
        prefixes = [p for p in prefixes if p]
        n = 0
        for event in self._since(prefixes, seq, limit):
            yield event
            n += 1
            if limit and n >= limit:
                return

    def _since(self, prefixes: Sequence[str], seq: int, limit: int) -> Iterable[Event]:
        if self.store is None:
            merged = heapq.merge(*(k.after(seq) for k in self._kept.values()), key=_seq_of)
            return (e for e in merged if matches(e.topic, prefixes))
        return self._since_stored(prefixes, seq, limit)

    def _since_stored(self, prefixes: Sequence[str], seq: int, limit: int) -> Iterator[Event]:
        assert self.store is not None
        upto = self.unsaved[0].seq - 1 if self.unsaved else self.last_seq
        chunk = 10_000 if not limit else min(limit, 10_000)
        while seq < upto:
            rows = self.store.events_since(prefixes, seq, upto, chunk)
            if not rows:
                break
            yield from rows
            seq = rows[-1].seq
        for event in list(self.unsaved):
            if event.seq > seq and matches(event.topic, prefixes):
                yield event

    def latest(self, topic: str, n: int) -> list[Event]:
        """The last ``n`` kept events of ``topic``, oldest first."""
        if self.store is None:
            kept = self._kept[self.rule_for(topic).prefix]
            found = [e for e in kept.newest_first() if e.topic == topic][:n]
            return found[::-1]
        pending = [e for e in self.unsaved if e.topic == topic][-n:]
        stored = self.store.latest_events(topic, n - len(pending)) if n > len(pending) else []
        return stored + pending

    def stats(self, wall: float | None = None) -> dict[str, Any]:
        """Per topic: last_seq, published (since start), events_per_s, last_ts."""
        wall = time.time() if wall is None else wall
        return {
            "last_seq": self.last_seq,
            "published": self.published,
            "lost": self.lost,
            "store": "journal" if self.store is not None else "memory",
            "kept_in_memory": sum(len(k) for k in self._kept.values()),
            "topics": {
                topic: {
                    "last_seq": f.last_seq,
                    "published": f.published,
                    "events_per_s": f.rate(wall),
                    "last_ts": f.last_ts,
                }
                for topic, f in sorted(self.figures.items())
            },
        }
