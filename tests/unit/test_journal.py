"""The SQLite WAL journal of guaranteed jobs, on a real file in tmp_path."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from emq_django.broker.journal import Journal, JournalError, StoredJob

WALL = 1_000_000.0


def put(
    job_id: bytes, state: str = "ready", queue: str = "default", at: float = WALL
) -> tuple[Any, ...]:
    return ("put", job_id, queue, b"guarantee", b"body-" + job_id, state, 0, 0.0, at, at)


def ids(journal: Journal) -> list[bytes]:
    return [row.id for row in journal.load()]


def other_connection(path: Path) -> list[tuple[Any, ...]]:
    """What another process sees: only committed rows."""
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT id, state FROM jobs ORDER BY seq").fetchall()
    finally:
        db.close()


@pytest.fixture
def journal(tmp_path: Path) -> Any:
    j = Journal(tmp_path / "journal.sqlite3")
    yield j
    j.close()


@pytest.mark.parametrize(("sync", "level"), [("normal", 1), ("full", 2)])
def test_journal_is_in_wal_mode_with_the_sync_level(tmp_path: Path, sync: str, level: int) -> None:
    path = tmp_path / "sub" / "journal.sqlite3"  # the directory is created
    journal = Journal(path, sync)
    try:
        assert journal.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert journal.db.execute("PRAGMA synchronous").fetchone()[0] == level
        journal.apply([put(b"a")])
    finally:
        journal.close()
    db = sqlite3.connect(path)  # WAL is persistent: a new connection sees it too
    try:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        db.close()


@pytest.mark.parametrize("sync", ["off", "NORMAL", "", "extra"])
def test_invalid_sync_is_a_value_error(tmp_path: Path, sync: str) -> None:
    with pytest.raises(ValueError, match="EMQ_JOURNAL_SYNC"):
        Journal(tmp_path / "journal.sqlite3", sync)
    assert not (tmp_path / "journal.sqlite3").exists()


def test_put_state_done_and_load(journal: Journal) -> None:
    journal.apply([put(b"a"), put(b"b", "delayed"), put(b"c")])
    journal.apply(
        [
            ("state", b"b", "dead", 3, 0.0, "ValueError", WALL + 5),
            ("done", b"c", WALL + 6),
        ]
    )
    rows = {row.id: row for row in journal.load()}
    assert list(rows) == [b"a", b"b", b"c"]  # oldest first
    assert rows[b"a"] == StoredJob(
        b"a", "default", b"guarantee", b"body-a", "ready", 0, 0.0, WALL, "", WALL
    )
    assert (rows[b"b"].state, rows[b"b"].attempts, rows[b"b"].error) == ("dead", 3, "ValueError")
    assert rows[b"b"].updated_at == WALL + 5
    assert (rows[b"c"].state, rows[b"c"].body) == ("done", b"")  # the body is dropped
    assert journal.commits == 2 and journal.errors == 0


def test_put_again_updates_the_state_only(journal: Journal) -> None:
    journal.apply([put(b"a", "spilled")])
    again = ("put", b"a", "other", b"", b"new body", "ready", 2, 0.0, WALL + 9, WALL + 9)
    journal.apply([again])
    (row,) = journal.load()
    assert (row.state, row.attempts, row.updated_at) == ("ready", 2, WALL + 9)
    assert (row.queue, row.body, row.enqueued_at) == ("default", b"body-a", WALL)


def test_delete_op(journal: Journal) -> None:
    journal.apply([put(b"a"), put(b"b")])
    journal.apply([("delete", b"a")])
    assert ids(journal) == [b"b"]


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
def test_apply_is_one_transaction(journal: Journal, bad: tuple[Any, ...]) -> None:
    journal.apply([put(b"a")])
    with pytest.raises(JournalError):
        journal.apply([put(b"b"), ("state", b"a", "dead", 1, 0.0, "E", WALL), bad, put(b"c")])
    assert journal.errors == 1
    # nothing of the failed batch was written: not even to this connection's view
    assert [(r.id, r.state) for r in journal.load()] == [(b"a", "ready")]
    assert other_connection(journal.path) == [(b"a", "ready")]
    assert not journal.db.in_transaction
    # and the journal still works
    journal.apply([put(b"d")])
    assert ids(journal) == [b"a", b"d"]
    assert other_connection(journal.path) == [(b"a", "ready"), (b"d", "ready")]


def test_a_duplicate_id_in_one_put_batch_is_one_row(journal: Journal) -> None:
    journal.apply([put(b"a"), put(b"a", "delayed")])
    assert [(r.id, r.state) for r in journal.load()] == [(b"a", "delayed")]


def test_prune_done_deletes_only_old_done_jobs(journal: Journal) -> None:
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


def test_load_spilled_by_queue_oldest_first_with_a_limit(journal: Journal) -> None:
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


def test_stats_count_jobs_by_state_and_size(journal: Journal) -> None:
    empty = journal.stats()
    assert empty["jobs"] == {} and empty["path"] == str(journal.path)
    journal.apply([put(b"a"), put(b"b"), put(b"c", "spilled"), put(b"d", "delayed")])
    journal.apply([("done", b"b", WALL), ("state", b"d", "dead", 1, 0.0, "E", WALL)])
    stats = journal.stats()
    assert stats["jobs"] == {"ready": 1, "done": 1, "spilled": 1, "dead": 1}
    assert stats["commits"] == 2 and stats["errors"] == 0
    files = [journal.path, Path(f"{journal.path}-wal")]
    assert stats["size_bytes"] == sum(p.stat().st_size for p in files if p.exists())
    assert stats["size_bytes"] > 0


def test_apply_on_a_closed_journal_is_a_journal_error(journal: Journal) -> None:
    journal.apply([put(b"a")])
    journal.db.close()
    with pytest.raises(JournalError) as info:
        journal.apply([put(b"b")])
    assert not isinstance(info.value, sqlite3.Error)
    assert str(journal.path) in str(info.value)
    assert journal.errors == 1


@pytest.mark.parametrize("how", ["directory", "corrupted"])
def test_a_journal_that_cannot_be_opened_is_a_journal_error(tmp_path: Path, how: str) -> None:
    """The broker should say what is wrong with its journal, not leak a sqlite3 error.
    (Tests run as root: a read-only directory would not stop them, so the path is a
    directory, or a file that is not a database.)"""
    path = tmp_path / "journal.sqlite3"
    if how == "directory":
        path.mkdir()
    else:
        path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(JournalError) as info:
        Journal(path)
    assert not isinstance(info.value, sqlite3.Error)


def test_a_committed_batch_survives_a_new_connection(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    first = Journal(path, "full")
    first.apply([put(b"a"), ("state", b"a", "delayed", 1, WALL + 30, "E", WALL)])
    first.close()
    second = Journal(path)
    try:
        (row,) = second.load()
        assert (row.id, row.state, row.run_after, row.attempts) == (b"a", "delayed", WALL + 30, 1)
    finally:
        second.close()


def test_checkpoints_run_off_the_writer_and_the_wal_is_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpointer thread copies the WAL back; once it is past the restart size
    and nearly copied, the writer's next commit restarts it: the WAL stays bounded
    and every committed row is there after a reopen."""
    from emq_django.broker import journal as journal_module

    monkeypatch.setattr(journal_module, "WAL_RESTART_BYTES", 256 * 1024)
    path = tmp_path / "journal.sqlite3"
    journal = Journal(path)
    wal = Path(f"{path}-wal")
    biggest = 0
    try:
        assert journal.db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        for n in range(200):
            batch = [put(b"%d-%d" % (n, i)) for i in range(10)]
            journal.apply([(*op[:4], b"x" * 1000, *op[5:]) for op in batch])
            biggest = max(biggest, wal.stat().st_size)
            if n % 20 == 0:
                time.sleep(0.1)  # the checkpointer's turn
        assert journal.checkpoints > 0
        assert journal.stats()["checkpoints"] == journal.checkpoints
    finally:
        journal.close()
    assert biggest < 2000 * 1100  # 2 MB of rows went through; the WAL was reused
    again = Journal(path)
    try:
        assert len(again.load()) == 2000
    finally:
        again.close()


def test_rows_committed_before_a_crash_are_there_without_a_checkpoint(tmp_path: Path) -> None:
    """The WAL alone holds a commit: a copy of the files taken while the journal is
    open (as a kill -9 leaves them) reloads every row."""
    import shutil

    path = tmp_path / "journal.sqlite3"
    journal = Journal(path)
    try:
        journal.apply([put(b"%d" % i) for i in range(500)])
        crashed = tmp_path / "crashed"
        crashed.mkdir()
        for suffix in ("", "-wal"):
            shutil.copy(f"{path}{suffix}", crashed / f"journal.sqlite3{suffix}")
    finally:
        journal.close()
    copy = Journal(crashed / "journal.sqlite3")
    try:
        assert len(copy.load()) == 500
    finally:
        copy.close()


def test_a_journal_with_the_old_state_index_gets_the_partial_ones(tmp_path: Path) -> None:
    """Journals written before the partial indexes open with their rows, and with
    the index every message used to update twice replaced."""
    path = tmp_path / "journal.sqlite3"
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(
        "CREATE TABLE jobs (seq INTEGER PRIMARY KEY, id BLOB NOT NULL UNIQUE,"
        " queue TEXT NOT NULL, headers BLOB NOT NULL, body BLOB, state TEXT NOT NULL,"
        " attempts INTEGER NOT NULL DEFAULT 0, run_after REAL NOT NULL DEFAULT 0,"
        " enqueued_at REAL NOT NULL, error TEXT NOT NULL DEFAULT '',"
        " updated_at REAL NOT NULL);"
        " CREATE INDEX jobs_state ON jobs (state, queue, seq);"
    )
    db.execute(
        "INSERT INTO jobs (id, queue, headers, body, state, enqueued_at, updated_at)"
        " VALUES (x'61', 'q', x'', x'62', 'spilled', 1, 1)"
    )
    db.commit()
    db.close()
    journal = Journal(path)
    try:
        names = {row[0] for row in journal.db.execute("SELECT name FROM sqlite_master")}
        assert "jobs_state" not in names and {"jobs_spilled", "jobs_done"} <= names
        assert [row.id for row in journal.load_spilled("q", 10)] == [b"a"]
    finally:
        journal.close()


def test_stats_of_a_journal_slow_to_count_come_from_the_checkpointer_thread(
    journal: Journal,
) -> None:
    """Once a count of the jobs took long (a backlog of guaranteed jobs), ``stats``
    returns the last count at once and the checkpointer's thread makes the next."""
    journal.apply([put(b"a"), put(b"b", "spilled")])
    assert journal.stats()["jobs"] == {"ready": 1, "spilled": 1}
    journal._count_took = 60.0  # as if the last count had taken a minute
    journal.apply([put(b"c", "spilled")])
    first = journal.stats()
    # the last count (unless that thread was quicker than this one)
    assert first["jobs"] in ({"ready": 1, "spilled": 1}, {"ready": 1, "spilled": 2})
    assert first["counted_s_ago"] >= 0
    deadline = time.monotonic() + 30
    while journal.stats()["jobs"] != {"ready": 1, "spilled": 2}:
        assert time.monotonic() < deadline, "the checkpointer's thread never counted"
        time.sleep(0.05)
