"""The subscriber's Clone-pattern state (emq_django/pubsub.py), fed frames built by
the codec: order, each event once, gaps sent to the snapshot, resume."""

from __future__ import annotations

import msgpack

from emq_django.broker.topics import Event
from emq_django.protocol import eventbus
from emq_django.pubsub import LATEST, CloneState, received


def live(seq: int, topic: str = "/a/x", data: object = None) -> list[bytes]:
    return eventbus.broadcast(Event(seq, topic, b""), msgpack.packb(data if data else seq))


def sync(seq: int, topic: str = "/a/x") -> list[bytes]:
    return eventbus.sync(Event(seq, topic, b""), msgpack.packb(seq))


def seqs(events: list[Event]) -> list[int]:
    return [e.seq for e in events]


def test_snapshot_then_live_each_event_once_in_order() -> None:
    state = CloneState(["/a/"], since=0)
    assert state.needs_sync(0.0, 0.0, 1.0)
    # emq's own fourth frame: tell it of events retention deleted (SYNCEXPIRED)
    assert state.syncstart(0.0) == [b"SYNCSTART", b"/a/", b"0", b"notify-expired"]
    assert state.on_live(live(3)) == []  # held while syncing
    out = state.on_snapshot(sync(1)) + state.on_snapshot(sync(2))
    out += state.on_snapshot(eventbus.syncend(b"/a/", 2))  # 3 came after the snapshot
    assert seqs(out) == [1, 2, 3] and state.last == 3
    assert seqs(state.on_live(live(3))) == []  # a duplicate
    assert seqs(state.on_live(live(4))) == [4]
    assert state.on_live(live(5, "/b/other")) == []  # not under the prefix


def test_a_jump_asks_the_snapshot_and_holds_later_events() -> None:
    state = CloneState(["/a/"], since=4)
    state.syncstart(0.0)
    state.on_snapshot(eventbus.syncend(b"/a/", 4))
    assert state.on_live(live(7)) == [] and state.wants_fill and state.gaps == 1
    assert state.syncstart(1.0)[2] == b"4"
    assert state.on_live(live(8)) == []
    out = state.on_snapshot(sync(6)) + state.on_snapshot(sync(7))
    out += state.on_snapshot(eventbus.syncend(b"/a/", 7))
    assert seqs(out) == [6, 7, 8] and state.last == 8 and not state.wants_fill
    assert state.from_snapshot == 2


def test_live_only_starts_from_the_current_sequence() -> None:
    state = CloneState([""], since=None)
    assert state.syncstart(0.0)[2] == str(LATEST).encode()
    assert state.on_live(live(11)) == []
    assert seqs(state.on_snapshot(eventbus.syncend(b"", 10))) == [11]


def test_a_lost_syncstart_is_asked_again_and_idle_checks() -> None:
    state = CloneState(["/a/"], since=0)
    state.syncstart(0.0)
    assert not state.needs_sync(1.0, 1.0, 1.0)
    assert state.needs_sync(6.0, 6.0, 1.0)  # no SYNCEND within SYNC_TIMEOUT
    state.on_snapshot(eventbus.syncend(b"/a/", 0))
    assert not state.needs_sync(7.0, 0.5, 1.0) and state.needs_sync(7.0, 1.0, 1.0)


def test_malformed_frames_are_dropped_and_counted() -> None:
    state = CloneState([""], since=0)
    assert state.on_live([b"/a", b"x"]) == [] and state.on_snapshot([b"WHAT"]) == []
    assert state.dropped == 2


def test_received_unpacks_messagepack() -> None:
    event = received(Event(1, "/a", msgpack.packb({"k": [1]}), "p", b"\x01" * 16, 2.0))
    assert event.data == {"k": [1]} and event.uuid == "01010101-0101-0101-0101-010101010101"


def test_the_late_answer_to_a_repeated_request_neither_lowers_last_nor_repeats() -> None:
    state = CloneState(["/a/"], since=0)
    state.syncstart(0.0)
    state.syncstart(6.0)  # no answer within SYNC_TIMEOUT: asked again
    assert seqs(state.on_snapshot(sync(1)) + state.on_snapshot(eventbus.syncend(b"/a/", 1))) == [1]
    assert seqs(state.on_live(live(2)) + state.on_live(live(3))) == [2, 3]
    # the second answer, late: the same event and an older sequence
    assert state.on_snapshot(sync(1)) == [] and state.on_snapshot(eventbus.syncend(b"/a/", 1)) == []
    assert state.last == 3 and seqs(state.on_live(live(4))) == [4]


# ---- emq's delivery batches (the batch publisher) ------------------------------------


def batch(first: int, n: int, topic: str = "/a/x") -> list[bytes]:
    flat: list[object] = []
    for seq in range(first, first + n):
        flat += (seq, "p", 2.5, b"\x02" * 16, msgpack.packb(seq))
    return eventbus.delivery_batch(topic.encode(), flat)


def test_a_batch_that_follows_on_yields_every_event_in_order() -> None:
    state = CloneState(["/a/"], since=0)
    state.syncstart(0.0)
    state.on_snapshot(eventbus.syncend(b"/a/", 4))
    out = state.on_live_batch(batch(5, 3))
    assert [(e.seq, e.data, e.producer, e.ts) for e in out] == [
        (5, 5, "p", 2.5),
        (6, 6, "p", 2.5),
        (7, 7, "p", 2.5),
    ]
    assert out[0].uuid == "02020202-0202-0202-0202-020202020202" and out[0].topic == "/a/x"
    assert state.last == 7 and state.live_seen == 3
    assert state.on_live_batch(batch(5, 3)) == []  # again: duplicates
    assert state.on_live_batch(batch(8, 2, "/b/x")) == []  # not under the prefix


def test_a_batch_after_a_jump_is_held_and_the_gap_filled_from_the_snapshot() -> None:
    state = CloneState(["/a/"], since=0)
    state.syncstart(0.0)
    state.on_snapshot(eventbus.syncend(b"/a/", 2))
    assert state.on_live_batch(batch(5, 2)) == [] and state.wants_fill and state.gaps == 1
    assert state.syncstart(1.0)[2] == b"2"
    out = state.on_snapshot(sync(3)) + state.on_snapshot(sync(4))
    out += state.on_snapshot(eventbus.syncend(b"/a/", 4))
    assert seqs(out) == [3, 4, 5, 6] and state.last == 6


def test_a_batch_overlapping_what_the_subscriber_has_yields_only_the_new_ones() -> None:
    state = CloneState([""], since=3)
    state.syncstart(0.0)
    state.on_snapshot(eventbus.syncend(b"", 3))
    assert seqs(state.on_live_batch(batch(2, 4))) == [4, 5]  # 2 and 3 it had


def test_malformed_batches_are_dropped_and_counted() -> None:
    state = CloneState([""], since=0)
    state.syncstart(0.0)
    state.on_snapshot(eventbus.syncend(b"", 0))
    bad = [
        [b"/a", b"EMQB"],  # two frames
        [b"/a", b"EMQX", msgpack.packb([])],  # not a batch
        [b"/a", b"EMQB", b"\xc1"],  # not MessagePack
        [b"/a", b"EMQB", msgpack.packb([1, "p", 2.0, b""])],  # 4 fields
        [b"/a", b"EMQB", msgpack.packb([1, 2, 2.0, b"", b"\x01"])],  # producer not text
        [b"/a", b"EMQB", msgpack.packb(["1", "p", 2.0, b"", b"\x01"])],  # seq not a number
        [b"\xff", b"EMQB", msgpack.packb([])],  # topic not UTF-8
    ]
    for frames in bad:
        assert state.on_live_batch(frames) == []
    assert state.dropped == len(bad) and state.last == 0
    assert seqs(state.on_live_batch(batch(1, 1))) == [1]  # and it goes on


def test_events_that_follow_on_are_yielded_while_a_snapshot_answer_is_awaited() -> None:
    """An idle check's request does not hold live events back: one that follows on
    from ``last`` is yielded at once, and the answer's copy of it is skipped; one
    after a jump waits for the answer, as before."""
    state = CloneState(["/a/"], since=0)
    state.syncstart(0.0)
    state.on_snapshot(eventbus.syncend(b"/a/", 2))
    state.syncstart(1.0)  # an idle check: asked from 2
    assert seqs(state.on_live(live(3))) == [3]  # follows on: at once
    assert [e.seq for e in state.on_live_batch(batch(4, 2))] == [4, 5]
    assert state.on_live(live(8)) == []  # a jump: held for the answer
    out = state.on_snapshot(sync(3)) + state.on_snapshot(sync(4)) + state.on_snapshot(sync(7))
    out += state.on_snapshot(eventbus.syncend(b"/a/", 7))
    assert seqs(out) == [7, 8] and state.last == 8  # 3 and 4 it had; 6 is elsewhere
    assert state.from_snapshot == 1 and state.gaps == 0


def test_a_syncexpired_above_last_is_queued_as_expired_and_moves_last() -> None:
    from emq_django.exceptions import EventsExpired
    from emq_django.pubsub import CloneState, Expired

    state = CloneState(["/a/"], 0)
    state.syncstart(0.0)
    (gone,) = state.on_snapshot([b"SYNCEXPIRED", b"/a/", b"1", b"40"])
    assert isinstance(gone, Expired) and (gone.first, gone.last) == (1, 40)
    assert state.last == 40 and isinstance(gone.error(), EventsExpired)
    assert state.on_snapshot([b"SYNCEXPIRED", b"/a/", b"1", b"30"]) == []  # nothing new
