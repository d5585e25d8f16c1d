"""The topic space: one sequence, kept events, replay, retention, restart; in memory
and through the journal (a real SQLite file in tmp_path)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from emq_django.broker.core import BrokerCore
from emq_django.broker.effects import Published
from emq_django.broker.journal import Journal
from emq_django.broker.state import BrokerConfig
from emq_django.broker.topics import TopicSpace, parse_retention

WALL = 1_000_000.0


def make_core(retention: Any = None, journal: Journal | None = None) -> BrokerCore:
    core = BrokerCore(BrokerConfig(1.0, 3), 0.0, topics=TopicSpace(retention))
    core.wall_offset = WALL
    if journal is not None:
        core.life.journal_ops = []
        core.topics.attach(journal, core.life)
    return core


def commit(core: BrokerCore, journal: Journal) -> None:
    """What the server does at the end of a loop turn."""
    ops, core.life.journal_ops = core.life.journal_ops or [], []
    journal.apply(ops)
    core.topics.saved()


def publish(core: BrokerCore, topic: str, n: int = 1, now: float = 0.0) -> list[int]:
    return [
        core.topic_publish(
            topic, b"%d" % i, producer="p", content_type="application/msgpack", now=now
        ).seq
        for i in range(n)
    ]


@pytest.fixture
def journal(tmp_path: Path) -> Any:
    j = Journal(tmp_path / "journal.sqlite3")
    yield j
    j.close()


def test_one_sequence_over_all_topics_and_a_published_effect_each() -> None:
    core = make_core()
    seqs = publish(core, "/a/x") + publish(core, "/b/y", 2) + publish(core, "/a/z")
    assert seqs == [1, 2, 3, 4]
    assert [e.event.seq for e in core.out if isinstance(e, Published)] == [1, 2, 3, 4]
    event = core.out[0].event  # type: ignore[union-attr]
    assert (event.topic, event.data, event.producer) == ("/a/x", b"0", "p")
    assert len(event.uuid) == 16 and event.ts == WALL
    assert core.counters["events_published"] == 4


@pytest.mark.parametrize("topic", ["", "x" * 256, "caf\udce9"])
def test_a_bad_topic_is_refused_with_value_error(topic: str) -> None:
    core = make_core()
    with pytest.raises(ValueError):
        core.topic_publish(topic, b"", producer="", content_type="", now=0.0)
    assert core.topics.last_seq == 0 and not core.out
    assert core.counters["events_refused"] == 1


def test_since_filters_by_prefix_and_sequence_in_memory() -> None:
    core = make_core()
    publish(core, "/orders/created", 3)  # 1..3
    publish(core, "/users/new", 2)  # 4, 5
    publish(core, "/orders/paid")  # 6
    topics = core.topics
    assert [e.seq for e in topics.since(["/orders/"], 0)] == [1, 2, 3, 6]
    assert [e.seq for e in topics.since(["/orders/"], 2)] == [3, 6]
    assert [e.seq for e in topics.since(["/users/", "/orders/paid"], 0)] == [4, 5, 6]
    assert [e.seq for e in topics.since([], 4)] == [5, 6]
    assert [e.seq for e in topics.since([""], 0, limit=2)] == [1, 2]
    assert [e.data for e in topics.latest("/orders/created", 2)] == [b"1", b"2"]


def test_retention_by_count_and_age_per_longest_prefix_in_memory() -> None:
    core = make_core({"/tmp/": {"max_count": 2}, "/old/": {"max_age": 10}})
    publish(core, "/tmp/a", 5)
    publish(core, "/keep/a", 5)
    publish(core, "/old/a", 3, now=0.0)
    publish(core, "/old/b", 1, now=20.0)
    core.topics.prune(WALL + 20.0)
    kept = [(e.topic, e.seq) for e in core.topics.since([], 0)]
    assert [s for t, s in kept if t == "/tmp/a"] == [4, 5]
    assert len([1 for t, _ in kept if t == "/keep/a"]) == 5
    assert [t for t, _ in kept if t.startswith("/old/")] == ["/old/b"]


def test_retention_settings_are_checked() -> None:
    rules = parse_retention('{"/a/": {"max_count": 3}}')
    assert [r.prefix for r in rules] == ["/a/", ""]
    with pytest.raises(ValueError):
        parse_retention({"/a/": {"max_cnt": 3}})
    with pytest.raises(ValueError):
        parse_retention({"/a/": {"max_age": -1}})


def test_journal_keeps_events_and_the_sequence_goes_on_after_a_restart(
    journal: Journal, tmp_path: Path
) -> None:
    core = make_core(journal=journal)
    publish(core, "/orders/a", 3)
    # before the commit, replay serves the unsaved events from memory
    assert [e.seq for e in core.topics.since(["/orders/"], 1)] == [2, 3]
    commit(core, journal)
    publish(core, "/users/b", 2)
    assert [e.seq for e in core.topics.since([], 0)] == [1, 2, 3, 4, 5]  # stored + unsaved
    commit(core, journal)
    journal.close()

    again = Journal(tmp_path / "journal.sqlite3")
    try:
        core2 = make_core(journal=again)
        assert core2.topics.last_seq == 5
        assert publish(core2, "/orders/a") == [6]
        commit(core2, again)
        events = list(core2.topics.since(["/orders/"], 0))
        assert [e.seq for e in events] == [1, 2, 3, 6]
        assert events[0].data == b"0" and events[0].content_type == "application/msgpack"
        assert core2.topics.stats()["topics"]["/users/b"]["last_seq"] == 5
        assert [e.seq for e in core2.topics.latest("/orders/a", 2)] == [3, 6]
        publish(core2, "/orders/a")  # 7, not committed yet: latest sees it too
        assert [e.seq for e in core2.topics.latest("/orders/a", 2)] == [6, 7]
    finally:
        again.close()


def test_journal_retention_keeps_the_sequence_when_every_event_is_pruned(
    journal: Journal, tmp_path: Path
) -> None:
    core = make_core({"": {"max_age": 5, "max_count": 0}}, journal=journal)
    publish(core, "/a", 3, now=0.0)
    commit(core, journal)
    core.topics.prune(WALL + 100.0)
    commit(core, journal)
    assert list(core.topics.since([], 0)) == []
    journal.close()
    again = Journal(tmp_path / "journal.sqlite3")
    try:
        assert make_core(journal=again).topics.last_seq == 3
    finally:
        again.close()


def test_journal_retention_by_count_per_rule_and_rules_changed_later(
    journal: Journal, tmp_path: Path
) -> None:
    core = make_core({"/tmp/": {"max_count": 2}}, journal=journal)
    publish(core, "/tmp/x", 5)
    publish(core, "/logs/y", 5)
    commit(core, journal)
    core.topics.prune(WALL)
    commit(core, journal)
    assert [e.seq for e in core.topics.since(["/tmp/"], 0)] == [4, 5]
    assert len(list(core.topics.since(["/logs/"], 0))) == 5
    journal.close()
    # restart with a rule for /logs/: the events written under "" are filed again
    again = Journal(tmp_path / "journal.sqlite3")
    try:
        core2 = make_core({"/logs/": {"max_count": 1}}, journal=again)
        core2.topics.prune(WALL)
        commit(core2, again)
        assert [e.seq for e in core2.topics.since(["/logs/"], 0)] == [10]
    finally:
        again.close()


def test_journal_retention_by_count_keeps_counting_after_the_first_prune(
    journal: Journal,
) -> None:
    """The journal counts each rule's events once, then keeps the count itself:
    events written between two prunes still count, and a pruned rule is not
    pruned again until it passes its limit."""
    core = make_core({"/tmp/": {"max_count": 3}}, journal=journal)
    publish(core, "/tmp/x", 2)
    commit(core, journal)
    core.topics.prune(WALL)
    commit(core, journal)
    assert len(list(core.topics.since(["/tmp/"], 0))) == 2
    publish(core, "/tmp/x", 4)
    commit(core, journal)
    core.topics.prune(WALL)
    commit(core, journal)
    assert [e.seq for e in core.topics.since(["/tmp/"], 0)] == [4, 5, 6]
    publish(core, "/tmp/x", 1)
    commit(core, journal)
    core.topics.prune(WALL)
    commit(core, journal)
    assert [e.seq for e in core.topics.since(["/tmp/"], 0)] == [5, 6, 7]


def test_a_failed_commit_drops_the_events_it_held(journal: Journal) -> None:
    core = make_core(journal=journal)
    publish(core, "/a", 2)
    assert core.lose_unsaved_events() == 2
    assert not [e for e in core.out if isinstance(e, Published)]
    assert core.topics.lost == 2


def test_journal_retention_by_age_takes_the_oldest_and_a_producer_behind_in_time(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Age retention reads a bounded number of rows a prune: the oldest events by
    number while they are past max_age (a few a prune here), and a sweep that
    goes round the rest finds an old event numbered after young ones."""
    from emq_django.broker import journal as journal_module

    monkeypatch.setattr(journal_module, "AGE_HEAD_ROWS", 2)
    monkeypatch.setattr(journal_module, "AGE_SWEEP_ROWS", 3)
    core = make_core({"": {"max_age": 50, "max_count": 0}}, journal=journal)
    publish(core, "/a", 5, now=0.0)  # 1-5: old by the time of the prunes
    publish(core, "/a", 4, now=90.0)  # 6-9: young
    late = core.topic_publish(  # 10: a producer whose clock is behind
        "/a", b"late", producer="q", content_type="application/msgpack", ts=WALL, now=90.0
    ).seq
    publish(core, "/a", 2, now=90.0)  # 11-12: young
    commit(core, journal)
    kept = []
    for _ in range(8):  # each prune deletes a few; together they get every old one
        core.topics.prune(WALL + 100.0)
        commit(core, journal)
        kept.append([e.seq for e in core.topics.since([], 0)])
    assert kept[0] == [6, 7, 8, 9, 10, 11, 12]  # 1-2 from the start, 3-5 by the sweep
    assert 10 in kept[1] and 10 not in kept[2]  # the sweep went on: 6-8, then 9-11
    assert kept[-1] == [6, 7, 8, 9, 11, 12] and late == 10


def test_a_kept_event_with_a_timestamp_out_of_range_is_still_servable() -> None:
    """An event stored before timestamps were checked (a journal written by an
    older broker) must not stop a snapshot: its time is sent clamped."""
    from emq_django.broker.topics import Event
    from emq_django.protocol import eventbus

    for ts in (1e23, -1e23, float("inf"), float("nan")):
        frames = eventbus.sync(Event(1, "/t", b"\x01", "p", b"", ts), b"\x01")
        assert frames[4].endswith(b"Z")


def test_in_memory_retention_records_what_it_deleted_for_the_rules_under_a_prefix() -> None:
    """Without a journal: what retention removed (by count) is told to a replay
    asking from below it, for the rules that cover the prefixes asked for."""
    from emq_django.broker.topics import TopicSpace

    topics = TopicSpace({"/a/": {"max_count": 2}, "": {"max_count": 100}})
    for i in range(5):
        topics.add("/a/x", b"%d" % i, "p", "", (), b"", 1.0, 1.0)
    topics.add("/b/x", b"b", "p", "", (), b"", 1.0, 1.0)
    assert [e.seq for e in topics.since([], 0)] == [4, 5, 6]
    assert topics.expired_above(["/a/"], 0) == 3  # 1..3 deleted from rule /a/
    assert topics.expired_above([""], 1) == 3
    assert topics.expired_above(["/a/"], 3) == 0  # nothing it still needs
    assert topics.expired_above(["/b/"], 0) == 0  # rule "" deleted nothing
    assert [e.seq for e in topics.since(["/a/"], 4, limit=1)] == [5]
