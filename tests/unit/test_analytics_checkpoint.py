"""The analytics checkpoint: new byte ranges of trace files, cut after whole lines."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from emq_django.analytics.checkpoint import Checkpoint, complete_end, stage

NOW = dt.datetime(2026, 3, 1, 10, 30, tzinfo=dt.UTC)


def test_plan_reads_new_complete_lines_and_commit_remembers_them(tmp_path: Path):
    old = tmp_path / "trace-20260301-09.jsonl"
    old.write_text('{"a":1}\n{"a":2}\n')
    current = tmp_path / "trace-20260301-10.jsonl"
    current.write_text('{"b":1}\n{"b":')  # the broker is half way through a line
    (tmp_path / "notes.txt").write_text("not a trace")
    ck = Checkpoint(tmp_path / "out" / "_checkpoint.json")

    sources = ck.plan(tmp_path, now=NOW)
    assert [(s.path.name, s.start, s.end, s.closed) for s in sources] == [
        (old.name, 0, 16, True),
        (current.name, 0, 8, False),
    ]
    staged = stage(sources, tmp_path / "staging")
    assert staged[0] == old  # a closed file is read where it is
    assert staged[1].read_text() == '{"b":1}\n'  # the open one is copied up to its last line
    ck.commit(sources)
    ck.save()

    again = Checkpoint.load(ck.path)
    assert again.plan(tmp_path, now=NOW) == []
    with current.open("a") as f:
        f.write('2}\n{"b":3}\n')
    [tail] = again.plan(tmp_path, now=NOW)
    assert (tail.start, tail.end) == (8, current.stat().st_size)
    assert stage([tail], tmp_path / "staging2")[0].read_text() == '{"b":2}\n{"b":3}\n'


def test_plan_honours_since_and_until_by_file_hour(tmp_path: Path):
    for hour in (8, 9, 10):
        (tmp_path / f"trace-20260301-{hour:02d}.jsonl").write_text("{}\n")
    ck = Checkpoint(tmp_path / "ck.json")
    since = dt.datetime(2026, 3, 1, 9, 30, tzinfo=dt.UTC)
    until = dt.datetime(2026, 3, 1, 10, tzinfo=dt.UTC)
    assert [s.path.name for s in ck.plan(tmp_path, since, until, now=NOW)] == [
        "trace-20260301-09.jsonl"
    ]


def test_complete_end_finds_the_last_newline_across_probe_chunks(tmp_path: Path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10 + b"\n" + b"y" * 200_000)
    assert complete_end(path, path.stat().st_size) == 11
    path.write_bytes(b"no newline")
    assert complete_end(path, 10) == 0


def test_emq_analyze_without_pyspark_says_how_to_install(monkeypatch, tmp_path: Path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "pyspark" else real(name, *a)
    )
    with pytest.raises(CommandError, match=r"pip install 'emq-django\[analytics\]'"):
        call_command("emq_analyze", "--trace-dir", str(tmp_path))


def test_emq_analyze_without_pyarrow_names_what_is_missing(monkeypatch, tmp_path: Path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("pyarrow", "datasketches") else real(name, *a),
    )
    with pytest.raises(CommandError, match=r"needs pyarrow, datasketches, .*\[analytics\]"):
        call_command("emq_analyze", "--trace-dir", str(tmp_path))
