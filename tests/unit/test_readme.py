"""README.md is a landing page: at most 150 lines, and every page it links to exists
(its python example runs in tests/unit/test_docs_examples.py)."""

from __future__ import annotations

import re

from tests.support import REPO_ROOT

README = REPO_ROOT / "README.md"


def test_the_readme_is_at_most_150_lines() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines: move the detail to docs/"


def test_every_page_the_readme_links_to_exists() -> None:
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", README.read_text())
    assert links, "README.md links to no docs page"
    assert [link for link in links if not (REPO_ROOT / link).exists()] == []


def test_the_readme_links_to_the_docs_of_every_feature() -> None:
    text = README.read_text()
    for page in ("getting-started", "tasks", "streaming", "guarantees", "scheduler", "admin"):
        assert re.search(rf"\(docs/(features/)?{page}\.md\)", text), page


def test_the_readme_links_to_every_page_of_the_docs_site() -> None:
    text = README.read_text()
    pages = sorted(str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "docs").rglob("*.md"))
    assert [page for page in pages if f"]({page})" not in text] == []
