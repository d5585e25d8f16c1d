"""The docs' code examples, read from the Markdown pages (docs/internals/docs.md).

Every fenced ``python`` block is an example. An HTML comment right before it may say
``<!-- docs-test: skip: <reason> -->`` (it is not run, for that reason),
``<!-- docs-test: requires: <module> -->`` (the page's examples skip where that
module is not installed: the EventMQ peer is only in .venv), and a
``<!-- docs-test: setup`` comment holds code run before the next block.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"

# A fenced python block, or a docs-test comment; in page order.
_TOKEN = re.compile(
    r"^(?P<indent>[ \t]*)```python[^\n]*\n(?P<code>.*?)^[ \t]*```[ \t]*$"
    r"|<!--\s*docs-test:\s*(?P<kind>skip|setup|requires)\b:?(?P<arg>.*?)-->",
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


def _dedent(code: str, indent: str) -> str:
    return "".join(line.removeprefix(indent) for line in code.splitlines(keepends=True))


def page_examples(path: Path, root: Path = DOCS) -> list[Example]:
    """The page's python examples, each with the docs-test comment before it."""
    text = path.read_text()
    examples: list[Example] = []
    skip, setup, requires = "", "", ""
    for match in _TOKEN.finditer(text):
        if match["kind"] == "skip":
            skip = match["arg"].strip() or "no reason given"
        elif match["kind"] == "requires":
            requires = match["arg"].strip()
        elif match["kind"] == "setup":
            setup += match["arg"] + "\n"
        else:
            line = text.count("\n", 0, match.start()) + 1
            code = _dedent(match["code"], match["indent"])
            page = str(path.relative_to(root))
            examples.append(Example(page, line, code, skip, setup, requires))
            skip, setup, requires = "", "", ""
    return examples


def all_examples() -> list[Example]:
    """The examples of README.md and of every page under docs/ (pages named from the
    repository's root)."""
    pages = [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]
    return [ex for path in pages for ex in page_examples(path, REPO)]
