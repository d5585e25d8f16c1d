"""docs/testing.md shows tested code: each of its Python examples is in the test
modules that run it (the examples that define tasks or tests, that is: a block
that only shows an import and a ``with`` is checked to compile)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "testing.md"
TESTS = (
    ROOT / "tests" / "unit" / "test_testing_broker.py",
    ROOT / "tests" / "integration" / "test_testing_mixin.py",
)


def examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)


def test_every_example_of_a_task_or_a_test_is_in_a_test_module() -> None:
    tested = "\n".join(path.read_text() for path in TESTS)
    shown = [code for code in examples() if re.search(r"^(def|class|@)", code, re.MULTILINE)]

    missing = [code.splitlines()[0] for code in shown if code not in tested]

    assert len(shown) >= 6
    assert missing == [], f"examples in {PAGE.name} that no test runs: {missing}"


def test_every_other_example_compiles() -> None:
    for code in examples():
        compile(code, str(PAGE), "exec")
