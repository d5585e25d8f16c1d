"""Python 3.11, 3.12 and 3.13: pyproject.toml declares them, and `make test` runs the
unit and integration tests on each other one it finds, skipping with a message one
it cannot find."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib

import pytest

from tests.support import REPO_ROOT

VERSIONS = ["3.11", "3.12", "3.13"]


def test_pyproject_declares_each_supported_python() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    declared = [
        c.rsplit(" :: ", 1)[1]
        for c in project["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    ]
    assert declared == VERSIONS
    assert project["requires-python"] == ">=3.11"


def test_make_test_covers_the_same_pythons() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert re.search(r"^PYTHONS := (.+)$", makefile, re.M)[1].split() == VERSIONS  # type: ignore[index]
    assert re.search(
        r"^test: .*\n(\t.*\n)*\t@\$\(MAKE\) --no-print-directory test-pythons$", makefile, re.M
    )


@pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")
def test_an_interpreter_not_found_is_skipped_with_a_message() -> None:
    # -o: never (re)build .venv here; PY: this interpreter stands for .venv's
    run = subprocess.run(
        [
            "make",
            "-s",
            "-o",
            ".venv/.stamp",
            "test-pythons",
            "PYTHONS=3.99",
            f"PY={sys.executable}",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "no Python 3.99 found, so its unit and integration run was skipped" in run.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")
def test_an_interpreter_that_exists_is_found() -> None:
    """The running interpreter's version is found (the check once compared the
    version with a literal "$v" inside single quotes, so every other Python was
    reported missing and its run skipped)."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    found = subprocess.run(
        ["make", "-s", "--no-print-directory", "which-python", f"V={version}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    assert found, f"make which-python found no Python {version}"
    said = subprocess.run(
        [found, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    assert said == version
