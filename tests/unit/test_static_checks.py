"""``make lint`` and ``make typecheck`` as tests, so that ``make test`` (and CI) fails
on a lint error, an unformatted file or a type error, not only when someone runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PATHS = [p for p in ("emq_django", "tests", "project", "bench", "docs") if (ROOT / p).exists()]


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    tool = BIN / argv[0]
    if not tool.exists():
        pytest.skip(f"{argv[0]} is not installed beside {sys.executable} (the dev extra has it)")
    return subprocess.run([str(tool), *argv[1:]], cwd=ROOT, capture_output=True, text=True)


def test_ruff_finds_nothing() -> None:
    done = run("ruff", "check", *PATHS)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_file_is_formatted() -> None:
    done = run("ruff", "format", "--check", *PATHS)
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_finds_no_type_error() -> None:
    done = run("mypy", "emq_django")
    assert done.returncode == 0, done.stdout + done.stderr
