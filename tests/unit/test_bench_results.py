"""bench/: every result file under bench/results/ with one naming scheme, none at the
root, and bench/results/SUMMARY.md up to date with the latest run of each benchmark."""

from __future__ import annotations

from bench.results_path import NAME, RESULTS, result_path
from bench.summary import SUMMARY, render
from tests.support import REPO_ROOT


def test_no_result_file_lies_at_the_root_of_bench() -> None:
    assert sorted(p.name for p in (REPO_ROOT / "bench").glob("*.json")) == []


def test_every_result_file_follows_the_naming_scheme() -> None:
    names = [p.name for p in RESULTS.glob("*.json")]
    assert names, "no result files found under bench/results/"
    assert [n for n in names if not NAME.match(n)] == []


def test_a_new_run_is_named_by_the_scheme() -> None:
    path = result_path("fair", "s28-quiet")
    assert path.parent == RESULTS
    assert NAME.match(path.name)["benchmark"] == "fair"  # type: ignore[index]


def test_the_summary_is_up_to_date() -> None:
    assert SUMMARY.read_text() == render(), (
        "bench/results/SUMMARY.md is stale: run bench/summary.py"
    )


def test_the_summary_names_the_latest_full_fair_run_and_its_load() -> None:
    row = next(line for line in SUMMARY.read_text().splitlines() if line.startswith("| fair |"))
    assert "fair-2026-11-27-s27-final.json" in row  # later runs there are --only comparisons
    assert "->" in row  # the load average before -> after
