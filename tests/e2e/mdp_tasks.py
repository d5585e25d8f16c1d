"""Tasks the Majordomo tests run on an emq job manager, and one that only a
Majordomo worker serves."""

from __future__ import annotations

from collections.abc import Generator

import emq_django as emq


@emq.task(queue="mdp-gen")
def countdown(n: int) -> Generator[int, None, str]:
    yield from range(n, 0, -1)
    return "liftoff"


@emq.task(queue="mdp-json")
def served_by_majordomo(x: int) -> int:  # never runs here: a majortomo worker answers
    raise AssertionError("this queue is served by a Majordomo worker")
