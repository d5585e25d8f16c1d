"""Every python example of the docs and of README.md runs (docs/internals/docs.md says
how they are marked): one test per page, its blocks in order in one namespace, under EMQ_EAGER
(but the blocks marked ``no-eager``), with the example project's settings and its database.
A block marked ``runs-in`` runs in the test file it names instead (against a broker
process: tests/e2e/test_docs_examples.py; in a fresh project:
tests/packaging/test_adoption.py). A page that needs Django 6.0's ``django.tasks`` is
marked ``djangotasks``: ``make test-dj6`` runs it on Django 6.0."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from tests.docs_examples import Example, all_examples, close_sockets, page_examples, run_example

_BY_PAGE: dict[str, list[Example]] = defaultdict(list)
for _example in all_examples():
    _BY_PAGE[_example.page].append(_example)

# The settings fragments of the docs add to what startproject wrote.
_SETTINGS_NAMESPACE = {"INSTALLED_APPS": [], "BASE_DIR": Path("/srv/mysite")}


# Where a module the docs import is missing, and what runs the page then.
_MISSING = {
    "django.tasks": "Django 6.0's django.tasks is not in this Django (make test-dj6 runs "
    "this page on Django 6.0)",
    "eventmq": "the released EventMQ peer is installed in .venv only",
}


def _runs_here(example: Example) -> bool:
    return not example.skip and not example.runs_in


def _page_param(page: str) -> object:
    needs_dj6 = any(e.requires == "django.tasks" for e in _BY_PAGE[page])
    return pytest.param(page, marks=[pytest.mark.djangotasks] if needs_dj6 else [])


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "page", [_page_param(p) for p, exs in sorted(_BY_PAGE.items()) if any(map(_runs_here, exs))]
)
def test_the_page_s_examples_run(page: str, settings: object) -> None:
    module = "example_" + page.removesuffix(".md").replace("/", "_").replace("-", "_")
    namespace: dict[str, object] = {"__name__": module, **_SETTINGS_NAMESPACE}
    for example in _BY_PAGE[page]:
        if example.requires:
            pytest.importorskip(example.requires, reason=_MISSING.get(example.requires, ""))
    try:
        for example in _BY_PAGE[page]:
            if _runs_here(example):
                settings.EMQ_EAGER = example.eager  # type: ignore[attr-defined]
                run_example(example, namespace)
    finally:
        close_sockets(namespace)


# The test files a ``runs-in`` comment may name: each runs the examples that name it
# (and checks that it does: test_the_examples_marked_for_this_file_run_here there).
RUNNERS = {
    "tests/e2e/test_docs_examples.py",
    "tests/packaging/test_adoption.py",
    "tests/e2e/test_otel.py",  # a tracer provider set for good: in a process of its own
}


def test_every_example_runs_here_or_in_the_test_file_it_names() -> None:
    """No example is skipped: each runs here, or in one of ``RUNNERS``; only a module
    missing from the interpreter (``_MISSING``: an outside cause) skips a page."""
    examples = all_examples()
    assert len(examples) >= 19, "the docs' examples were not found"
    assert not [(e.page, e.line, e.skip) for e in examples if e.skip]
    assert {e.runs_in for e in examples if e.runs_in} <= RUNNERS
    assert {e.requires for e in examples if e.requires} <= set(_MISSING)


def test_the_django_6_run_runs_the_page_that_imports_django_tasks() -> None:
    """``make test-dj6`` runs the tests marked djangotasks in DJ6_TESTS on Django 6.0:
    this file must be among them, or that page would run nowhere."""
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    [line] = [x for x in makefile.splitlines() if x.startswith("DJ6_TESTS =")]
    assert "tests/unit/test_docs_examples.py" in line.split()
    assert [p for p, exs in _BY_PAGE.items() if any(e.requires == "django.tasks" for e in exs)]


def test_the_reader_sees_skip_and_setup_comments(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```python\na = 1\n```\n"
        "<!-- docs-test: skip: needs a running broker -->\n```python\nb = 2\n```\n"
        "<!-- docs-test: setup\nc = 3\n-->\n  ```python\n  d = c\n  ```\n"
        "<!-- docs-test: requires: eventmq -->\n```python\nimport eventmq\n```\n"
        "<!-- docs-test: runs-in: tests/e2e/test_docs_examples.py -->\n```python\ne = 5\n```\n"
        "<!-- docs-test: then\nassert e == 5\n-->\n"
        "<!-- docs-test: no-eager -->\n```python\nf = 6\n```\n"
    )
    first, second, third, fourth, fifth, sixth = page_examples(page, tmp_path)
    assert (first.skip, first.code) == ("", "a = 1\n")
    assert second.skip == "needs a running broker"
    assert ("c = 3" in third.setup, third.code, third.skip) == (True, "d = c\n", "")
    assert (fourth.requires, third.requires) == ("eventmq", "")
    assert (fifth.runs_in, fifth.then.strip(), fifth.eager) == (
        "tests/e2e/test_docs_examples.py",
        "assert e == 5",
        True,
    )
    assert (sixth.eager, sixth.runs_in, sixth.then, fourth.runs_in) == (False, "", "", "")
