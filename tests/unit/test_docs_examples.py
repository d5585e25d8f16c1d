"""Every python example of the docs and of README.md runs (docs/internals/docs.md says
how they are marked): one test per page, its blocks in order in one namespace, under EMQ_EAGER,
with the example project's settings and its database."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
import zmq

from tests.docs_examples import Example, all_examples, page_examples

_BY_PAGE: dict[str, list[Example]] = defaultdict(list)
for _example in all_examples():
    _BY_PAGE[_example.page].append(_example)

# The settings fragments of the docs add to what startproject wrote.
_SETTINGS_NAMESPACE = {"INSTALLED_APPS": [], "BASE_DIR": Path("/srv/mysite")}


def _run(example: Example, namespace: dict[str, object]) -> None:
    where = f"{example.page}:{example.line}"
    if example.setup:
        exec(compile(example.setup, f"{where} (setup)", "exec"), namespace)
    exec(compile(example.code, where, "exec"), namespace)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "page", sorted(p for p, exs in _BY_PAGE.items() if any(not e.skip for e in exs))
)
def test_the_page_s_examples_run(page: str, settings: object) -> None:
    settings.EMQ_EAGER = True  # type: ignore[attr-defined]
    module = "example_" + page.removesuffix(".md").replace("/", "_").replace("-", "_")
    namespace: dict[str, object] = {"__name__": module, **_SETTINGS_NAMESPACE}
    for example in _BY_PAGE[page]:
        if example.requires:
            pytest.importorskip(example.requires, reason=f"{page} imports it")
    try:
        for example in _BY_PAGE[page]:
            if not example.skip:
                _run(example, namespace)
    finally:
        _close_sockets(namespace)


def _close_sockets(namespace: dict[str, object]) -> None:
    """Close the ZeroMQ sockets an example left open (EventMQ's Sender holds one)."""
    for value in namespace.values():
        held = [value, *getattr(value, "__dict__", {}).values()]
        for candidate in held:
            if isinstance(candidate, zmq.Socket) and not candidate.closed:
                candidate.close(linger=0)


def test_only_a_small_minority_of_examples_is_skipped_each_with_its_reason() -> None:
    examples = all_examples()
    skipped = [e for e in examples if e.skip]
    assert len(examples) >= 10, "the docs' examples were not found"
    assert all(len(e.skip) > 10 for e in skipped), [(e.page, e.line, e.skip) for e in skipped]
    assert len(skipped) * 4 <= len(examples), [(e.page, e.line, e.skip) for e in skipped]


def test_the_reader_sees_skip_and_setup_comments(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```python\na = 1\n```\n"
        "<!-- docs-test: skip: needs a running broker -->\n```python\nb = 2\n```\n"
        "<!-- docs-test: setup\nc = 3\n-->\n  ```python\n  d = c\n  ```\n"
        "<!-- docs-test: requires: eventmq -->\n```python\nimport eventmq\n```\n"
    )
    first, second, third, fourth = page_examples(page, tmp_path)
    assert (first.skip, first.code) == ("", "a = 1\n")
    assert second.skip == "needs a running broker"
    assert ("c = 3" in third.setup, third.code, third.skip) == (True, "d = c\n", "")
    assert (fourth.requires, third.requires) == ("eventmq", "")
