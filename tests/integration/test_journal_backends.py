"""The journal's semantics, the same on both back ends: the SQLite file
(broker/journal.py) and PostgreSQL (broker/journal_pg.py, on a cluster of the
tests' own). Jobs and their states, de-duplication by id, one transaction per
apply, spilled jobs, counts, and the topic store with its retention rules; each
case also opens the journal again, as a restarted (or a standby) broker does."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from emq_django.broker.journal import Journal, StoredJob
from emq_django.broker.journal_pg import PgJournal
from emq_django.exceptions import JournalError
from tests.unit.test_topics import commit, make_core, publish

WALL = 1_000_000.0
AnyJournal = Journal | PgJournal
Opener = Callable[[], Any]


def put(
    job_id: bytes, state: str = "ready", queue: str = "default", at: float = WALL
) -> tuple[Any, ...]:
    return ("put", job_id, queue, b"guarantee", b"body-" + job_id, state, 0, 0.0, at, at)


def ids(journal: AnyJournal) -> list[bytes]:
    return [row.id for row in journal.load()]


@pytest.fixture(params=["sqlite", "postgres"])
def reopen(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens the test's journal (again): every one opened is closed after the test."""
    opened: list[AnyJournal] = []
    if request.param == "sqlite":
        path = tmp_path / "journal.sqlite3"

        def make() -> AnyJournal:
            return Journal(path)
    else:
        url = request.getfixturevalue("pg_url")

        def make() -> AnyJournal:
            return PgJournal(url, name="test")

    def opener() -> AnyJournal:
        journal = make()
        opened.append(journal)
        return journal

    yield opener
    for journal in opened:
        journal.close()


@pytest.fixture
def journal(reopen: Opener) -> AnyJournal:
    return reopen()  # type: ignore[no-any-return]


def test_put_state_done_and_load(journal: AnyJournal, reopen: Opener) -> None:
    journal.apply([put(b"a"), put(b"b", "delayed"), put(b"c")])
    journal.apply(
        [
            ("state", b"b", "dead", 3, 0.0, "ValueError", WALL + 5),
            ("done", b"c", WALL + 6),
        ]
    )
    for seen in (journal, reopen()):
        rows = {row.id: row for row in seen.load()}
        assert sorted(rows) == [b"a", b"b", b"c"]
        # the jobs not done, oldest first (an ended job's place: PostgreSQL's emq_done
        # ids come first, the SQLite journal's done rows stay where they were put)
        assert [job_id for job_id, row in rows.items() if row.state != "done"] == [b"a", b"b"]
        assert rows[b"a"] == StoredJob(
            b"a", "default", b"guarantee", b"body-a", "ready", 0, 0.0, WALL, "", WALL
        )
        assert (rows[b"b"].state, rows[b"b"].attempts, rows[b"b"].error) == (
            "dead",
            3,
            "ValueError",
        )
        assert rows[b"b"].updated_at == WALL + 5
        assert (rows[b"c"].state, rows[b"c"].body) == ("done", b"")  # the body is dropped
    assert journal.commits == 2 and journal.errors == 0


def test_put_again_updates_the_state_only(journal: AnyJournal) -> None:
    """A resent job (de-duplication by id): one row, its first body and queue."""
    journal.apply([put(b"a", "spilled")])
    again = ("put", b"a", "other", b"", b"new body", "ready", 2, 0.0, WALL + 9, WALL + 9)
    journal.apply([again])
    (row,) = journal.load()
    assert (row.state, row.attempts, row.updated_at) == ("ready", 2, WALL + 9)
    assert (row.queue, row.body, row.enqueued_at) == ("default", b"body-a", WALL)


def test_delete_and_a_duplicate_id_in_one_batch(journal: AnyJournal) -> None:
    journal.apply([put(b"a"), put(b"b"), put(b"b", "delayed")])
    journal.apply([("delete", b"a")])
    assert [(r.id, r.state) for r in journal.load()] == [(b"b", "delayed")]


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(("put", b"x", None, b"", b"", "ready", 0, 0.0, WALL, WALL), id="null-queue"),
        pytest.param(("put", b"x", "q", b"", b"", None, 0, 0.0, WALL, WALL), id="null-state"),
        pytest.param(("state", b"a", "dead", 0, 0.0, object(), WALL), id="unbindable-value"),
        pytest.param(("nonsense", b"a"), id="unknown-op"),
        pytest.param(("done", b"a"), id="wrong-arity"),
    ],
)
def test_apply_is_one_transaction(
    journal: AnyJournal, reopen: Opener, bad: tuple[Any, ...]
) -> None:
    journal.apply([put(b"a")])
    with pytest.raises(JournalError):
        journal.apply([put(b"b"), ("state", b"a", "dead", 1, 0.0, "E", WALL), bad, put(b"c")])
    assert journal.errors == 1
    # nothing of the failed batch was written, seen from here or another connection
    assert [(r.id, r.state) for r in journal.load()] == [(b"a", "ready")]
    assert [(r.id, r.state) for r in reopen().load()] == [(b"a", "ready")]
    journal.apply([put(b"d")])  # and the journal still works
    assert ids(reopen()) == [b"a", b"d"]


def test_prune_done_deletes_only_old_done_jobs(journal: AnyJournal) -> None:
    journal.apply([put(b"old"), put(b"new"), put(b"live"), put(b"dead")])
    journal.apply(
        [
            ("done", b"old", WALL + 10),
            ("done", b"new", WALL + 100),
            ("state", b"dead", "dead", 1, 0.0, "E", WALL + 10),
        ]
    )
    journal.apply([("prune_done", WALL + 50)])
    assert ids(journal) == [b"new", b"live", b"dead"]
    journal.apply([("prune_done", WALL + 1000)])
    assert ids(journal) == [b"live", b"dead"]


def test_load_spilled_by_queue_oldest_first_with_a_limit(journal: AnyJournal) -> None:
    journal.apply(
        [
            put(b"s1", "spilled"),
            put(b"r1", "ready"),
            put(b"s2", "spilled", queue="other"),
            put(b"s3", "spilled"),
            put(b"s4", "spilled"),
        ]
    )
    assert [r.id for r in journal.load_spilled("default", 2)] == [b"s1", b"s3"]
    assert [r.id for r in journal.load_spilled("default", 10)] == [b"s1", b"s3", b"s4"]
    assert [r.id for r in journal.load_spilled("other", 10)] == [b"s2"]
    assert journal.load_spilled("none", 10) == []
    assert journal.load_spilled("default", 10)[0].body == b"body-s1"


def test_stats_count_jobs_by_state(journal: AnyJournal) -> None:
    assert journal.stats()["jobs"] == {}
    journal.apply([put(b"a"), put(b"b"), put(b"c", "spilled"), put(b"d", "delayed")])
    journal.apply([("done", b"b", WALL), ("state", b"d", "dead", 1, 0.0, "E", WALL)])
    stats = journal.stats()
    assert stats["jobs"] == {"ready": 1, "done": 1, "spilled": 1, "dead": 1}
    assert stats["commits"] == 2 and stats["errors"] == 0
    assert stats["size_bytes"] > 0 and stats["events"] == 0


# ---- the topic store (broker/topics.py through the journal) --------------------------


def test_events_and_the_sequence_go_on_after_a_restart(journal: AnyJournal, reopen: Opener) -> None:
    core = make_core(journal=journal)  # type: ignore[arg-type]
    publish(core, "/orders/a", 3)
    commit(core, journal)  # type: ignore[arg-type]
    publish(core, "/users/b", 2)
    commit(core, journal)  # type: ignore[arg-type]
    again = reopen()
    core2 = make_core(journal=again)
    assert core2.topics.last_seq == 5
    assert publish(core2, "/orders/a") == [6]
    commit(core2, again)
    events = list(core2.topics.since(["/orders/"], 0))
    assert [e.seq for e in events] == [1, 2, 3, 6]
    assert events[0].data == b"0" and events[0].content_type == "application/msgpack"
    assert core2.topics.stats()["topics"]["/users/b"]["last_seq"] == 5
    assert [e.seq for e in core2.topics.latest("/orders/a", 2)] == [3, 6]
    assert [e.seq for e in again.events_since(["/users/", "/orders/a"], 1, 5, 10)] == [2, 3, 4, 5]


def test_retention_keeps_the_sequence_when_every_event_is_pruned(
    journal: AnyJournal, reopen: Opener
) -> None:
    core = make_core({"": {"max_age": 5, "max_count": 0}}, journal=journal)  # type: ignore[arg-type]
    publish(core, "/a", 3, now=0.0)
    commit(core, journal)  # type: ignore[arg-type]
    core.topics.prune(WALL + 100.0)
    commit(core, journal)  # type: ignore[arg-type]
    assert list(core.topics.since([], 0)) == []
    again = reopen()
    assert make_core(journal=again).topics.last_seq == 3
    assert again.expired_upto() == {"": 3}


def test_retention_by_count_per_rule_and_rules_changed_later(
    journal: AnyJournal, reopen: Opener
) -> None:
    core = make_core({"/tmp/": {"max_count": 2}}, journal=journal)  # type: ignore[arg-type]
    publish(core, "/tmp/x", 5)
    publish(core, "/logs/y", 5)
    commit(core, journal)  # type: ignore[arg-type]
    core.topics.prune(WALL)
    commit(core, journal)  # type: ignore[arg-type]
    assert [e.seq for e in core.topics.since(["/tmp/"], 0)] == [4, 5]
    assert len(list(core.topics.since(["/logs/"], 0))) == 5
    assert journal.expired_upto()["/tmp/"] == 3
    # restart with a rule for /logs/: the events written under "" are filed again
    again = reopen()
    core2 = make_core({"/logs/": {"max_count": 1}}, journal=again)
    core2.topics.prune(WALL)
    commit(core2, again)
    assert [e.seq for e in core2.topics.since(["/logs/"], 0)] == [10]


def test_retention_by_count_keeps_counting_after_the_first_prune(journal: AnyJournal) -> None:
    core = make_core({"/tmp/": {"max_count": 3}}, journal=journal)  # type: ignore[arg-type]
    publish(core, "/tmp/x", 2)
    commit(core, journal)  # type: ignore[arg-type]
    core.topics.prune(WALL)
    commit(core, journal)  # type: ignore[arg-type]
    assert len(list(core.topics.since(["/tmp/"], 0))) == 2
    publish(core, "/tmp/x", 4)
    commit(core, journal)  # type: ignore[arg-type]
    core.topics.prune(WALL)
    commit(core, journal)  # type: ignore[arg-type]
    assert [e.seq for e in core.topics.since(["/tmp/"], 0)] == [4, 5, 6]


def test_retention_by_age_takes_the_oldest_and_a_producer_behind_in_time(
    journal: AnyJournal, monkeypatch: pytest.MonkeyPatch
) -> None:
    from emq_django.broker import journal as journal_module

    monkeypatch.setattr(journal_module, "AGE_HEAD_ROWS", 2)
    monkeypatch.setattr(journal_module, "AGE_SWEEP_ROWS", 3)
    core = make_core({"": {"max_age": 50, "max_count": 0}}, journal=journal)  # type: ignore[arg-type]
    publish(core, "/a", 5, now=0.0)  # 1-5: old by the time of the prunes
    publish(core, "/a", 4, now=90.0)  # 6-9: young
    late = core.topic_publish(  # 10: a producer whose clock is behind
        "/a", b"late", producer="q", content_type="application/msgpack", ts=WALL, now=90.0
    ).seq
    publish(core, "/a", 2, now=90.0)  # 11-12: young
    commit(core, journal)  # type: ignore[arg-type]
    kept = []
    for _ in range(8):
        core.topics.prune(WALL + 100.0)
        commit(core, journal)  # type: ignore[arg-type]
        kept.append([e.seq for e in core.topics.since([], 0)])
    assert kept[0] == [6, 7, 8, 9, 10, 11, 12]
    assert 10 in kept[1] and 10 not in kept[2]
    assert kept[-1] == [6, 7, 8, 9, 11, 12] and late == 10
