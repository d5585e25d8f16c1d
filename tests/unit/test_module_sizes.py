"""No module in emq_django over MAX_LINES lines, except those named with a reason.

A module that big does several things; split it by role (issue 31, "A house you
can live in"), and keep the old name importable where code imports from it.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "emq_django"
MAX_LINES = 500

# path (relative to emq_django/) -> why it may be longer. An entry whose module
# has come under the limit fails the test below: take it out.
ALLOWED = {
    "broker/core.py": "being split (issue 31, R1: the core's typed effects and traits)",
    "broker/server.py": "being split (issue 31, R1: ports own their output)",
    "broker/journal.py": "being split (issue 31, R1: typed journal operations)",
    "worker/process.py": "the slot worker's loop; the reconnect and unstarted-job work merged "
    "beside the split put it a few lines over: its job run is the next to split out",
}


def line_counts() -> dict[str, int]:
    return {
        path.relative_to(PACKAGE).as_posix(): len(path.read_bytes().splitlines())
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def test_no_module_over_the_limit_but_the_named_ones() -> None:
    over = {
        path: lines
        for path, lines in line_counts().items()
        if lines > MAX_LINES and path not in ALLOWED
    }
    assert not over, (
        f"modules over {MAX_LINES} lines: {over}; split them by role, "
        "or name them in ALLOWED with the reason"
    )


def test_every_named_module_is_still_over_the_limit() -> None:
    counts = line_counts()
    stale = sorted(path for path in ALLOWED if counts.get(path, 0) <= MAX_LINES)
    assert not stale, f"{stale} are at most {MAX_LINES} lines (or gone): take them out of ALLOWED"
