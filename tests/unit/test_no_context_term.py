"""No test ends a ZeroMQ context with ``term()``.

``Context.term()`` waits for every socket of the context to be closed and its
messages to leave. After a failed test a socket is often still open (the
assertion fired before its ``close()``), and then ``term()`` waits for ever:
libzmq blocks in C, where pytest-timeout cannot interrupt it, and the whole run
hangs at that teardown (seen in test_curve and test_broker_incarnation).
``destroy(linger=0)`` closes what is left, dropping unsent messages, and returns.
"""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
TERM = re.compile(r"\.term\(\)")


def test_no_test_terms_a_zeromq_context() -> None:
    found = [
        f"{path.relative_to(TESTS)}:{n}"
        for path in sorted(TESTS.rglob("*.py"))
        if path != Path(__file__).resolve()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if TERM.search(line)
    ]
    assert not found, f"use context.destroy(linger=0), which cannot hang: {found}"
