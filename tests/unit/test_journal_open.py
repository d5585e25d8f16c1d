"""Opening the journal: an empty or foreign file refuses to start; ``new`` starts empty."""

from __future__ import annotations

from pathlib import Path

import pytest

from emq_django.broker.journal import Journal, JournalError


def test_zero_byte_journal_refuses_to_open(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    path.write_bytes(b"")
    with pytest.raises(JournalError, match="empty file.*--new-journal"):
        Journal(path)


def test_unreadable_journal_refuses_to_open(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    path.write_bytes(b"this is not a journal at all")
    with pytest.raises(JournalError, match="not a journal"):
        Journal(path)


def test_new_journal_moves_the_old_file_aside_and_starts_empty(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    path.write_bytes(b"")
    journal = Journal(path, new=True)
    try:
        assert journal.load() == []
    finally:
        journal.close()
    assert [p.name for p in tmp_path.glob("journal.sqlite3.old-*")]
    Journal(path).close()  # a real journal now: opens without --new-journal


def test_missing_journal_is_created(tmp_path: Path) -> None:
    Journal(tmp_path / "sub" / "journal.sqlite3").close()


@pytest.mark.parametrize("keep", [100, 4096], ids=["schema-damaged", "tables-damaged"])
def test_damaged_journal_says_what_to_do(tmp_path: Path, keep: int) -> None:
    """A journal damaged past its header ("database disk image is malformed") says
    what to do about it, as an empty or foreign file does (issue 29, item 14)."""
    path = tmp_path / "journal.sqlite3"
    Journal(path).close()
    data = bytearray(path.read_bytes())
    data[keep:] = b"\xaa" * (len(data) - keep)
    path.write_bytes(bytes(data))
    with pytest.raises(JournalError, match="malformed.*--new-journal"):
        Journal(path).load()
