"""The docs' code examples, read from the Markdown pages (docs/internals/docs.md).

Every fenced ``python`` block is an example. An HTML comment right before it may say
``<!-- docs-test: skip: <reason> -->`` (it is not run, for that reason),
``<!-- docs-test: requires: <module> -->`` (the page's examples skip where that
module is not installed: the EventMQ peer is only in .venv, Django 6.0's
``django.tasks`` only in the Django 6.0 run), ``<!-- docs-test: runs-in: <test file> -->``
(that test file runs it, not tests/unit/test_docs_examples.py: against a broker
process, or in a fresh project), ``<!-- docs-test: no-eager -->`` (it runs with
``EMQ_EAGER`` off), and a ``<!-- docs-test: setup`` comment holds code run before
the next block. A ``<!-- docs-test: then`` comment right after a block holds code
run after it (a check of what it did, invisible on the page).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"

# A fenced python block, or a docs-test comment; in page order.
_TOKEN = re.compile(
    r"^(?P<indent>[ \t]*)```python[^\n]*\n(?P<code>.*?)^[ \t]*```[ \t]*$"
    r"|^[ \t]*<!--\s*docs-test:\s*"
    r"(?P<kind>skip|setup|requires|runs-in|no-eager|then)\b:?(?P<arg>.*?)-->",
    re.S | re.M,
)


@dataclass(frozen=True)
class Example:
    page: str  # relative to the root it was read from (the repository's, in all_examples)
    line: int  # of the opening fence
    code: str
    skip: str  # the reason it is not run; '' runs it
    setup: str  # code run before it
    requires: str = ""  # a module it imports that not every venv has
    runs_in: str = ""  # the test file that runs it (relative to the repository), if not ours
    eager: bool = True  # run under EMQ_EAGER
    then: str = ""  # code run after it


def _dedent(code: str, indent: str) -> str:
    return "".join(line.removeprefix(indent) for line in code.splitlines(keepends=True))


def page_examples(path: Path, root: Path = DOCS) -> list[Example]:
    """The page's python examples, each with the docs-test comment before it."""
    text = path.read_text()
    examples: list[Example] = []
    skip, setup, requires, runs_in, eager = "", "", "", "", True
    for match in _TOKEN.finditer(text):
        if match["kind"] == "skip":
            skip = match["arg"].strip() or "no reason given"
        elif match["kind"] == "requires":
            requires = match["arg"].strip()
        elif match["kind"] == "runs-in":
            runs_in = match["arg"].strip()
        elif match["kind"] == "no-eager":
            eager = False
        elif match["kind"] == "setup":
            setup += match["arg"] + "\n"
        elif match["kind"] == "then":
            assert examples, f"{path}: a 'then' comment before any block"
            last = examples[-1]
            examples[-1] = replace(last, then=last.then + match["arg"] + "\n")
        else:
            line = text.count("\n", 0, match.start()) + 1
            code = _dedent(match["code"], match["indent"])
            page = str(path.relative_to(root))
            examples.append(Example(page, line, code, skip, setup, requires, runs_in, eager))
            skip, setup, requires, runs_in, eager = "", "", "", "", True
    return examples


def all_examples() -> list[Example]:
    """The examples of README.md and of every page under docs/ (pages named from the
    repository's root)."""
    pages = [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
    return [ex for path in pages for ex in page_examples(path, REPO)]


def examples_run_in(test_file: str) -> list[Example]:
    """The examples whose ``runs-in`` comment names ``test_file`` (as
    ``tests/e2e/test_docs_examples.py``)."""
    return [e for e in all_examples() if e.runs_in == test_file]


def run_example(example: Example, namespace: dict[str, object]) -> None:
    """The block, after its setup and before its ``then`` check, in ``namespace``."""
    where = f"{example.page}:{example.line}"
    if example.setup:
        exec(compile(example.setup, f"{where} (setup)", "exec"), namespace)
    exec(compile(example.code, where, "exec"), namespace)
    if example.then:
        exec(compile(example.then, f"{where} (then)", "exec"), namespace)


def close_sockets(namespace: dict[str, object]) -> None:
    """Close the ZeroMQ sockets an example left open (EventMQ's Sender holds one)."""
    import zmq

    for value in namespace.values():
        held = [value, *getattr(value, "__dict__", {}).values()]
        for candidate in held:
            if isinstance(candidate, zmq.Socket) and not candidate.closed:
                candidate.close(linger=0)
