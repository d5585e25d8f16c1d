"""The docs site: `mkdocs build --strict` passes (warnings are errors), and the settings
reference names every EMQ_* setting the code reads."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from emq_django.settings_reference import settings_reference
from tests.support import REPO_ROOT

pytestmark = pytest.mark.timeout(180)

# Names in the code that look like settings and are not: a constant, and prefixes.
NOT_SETTINGS = {"EMQ_APPS", "EMQ_BUS_", "EMQ_CURVE_", "EMQ_SCHEDULER_"}


def settings_the_code_names() -> set[str]:
    names: set[str] = set()
    for path in (REPO_ROOT / "emq_django").rglob("*.py"):
        names |= set(re.findall(r"\bEMQ_[A-Z0-9_]+", path.read_text()))
    return names - NOT_SETTINGS


def test_the_settings_reference_names_every_setting_the_code_reads() -> None:
    documented = {s.name for s in settings_reference()}
    assert settings_the_code_names() - documented == set()
    assert all(s.doc and s.default for s in settings_reference())


def test_the_docs_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    try:
        import mkdocs  # noqa: F401
    except ImportError:
        pytest.fail(
            "mkdocs is missing: the dev extra has it (make venv, or pip install -e '.[docs]')"
        )
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=REPO_ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert build.returncode == 0, build.stderr
    settings_page = (tmp_path / "reference" / "settings" / "index.html").read_text()
    assert "EMQ_SCHEDULER_POLL" in settings_page  # the generated table is in the page
    commands_page = (tmp_path / "reference" / "commands" / "index.html").read_text()
    assert "usage: manage.py emq_jobmanager" in commands_page


def test_every_page_under_docs_is_in_the_nav() -> None:
    nav = (REPO_ROOT / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1]
    docs = REPO_ROOT / "docs"
    pages = sorted(str(p.relative_to(docs)) for p in docs.rglob("*.md"))
    assert [page for page in pages if f": {page}\n" not in nav + "\n"] == []
