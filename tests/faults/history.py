"""The history checker: what the clients had accepted against what ran.

Lost: accepted, never completed. Unexpected: completed, never accepted.
Duplicated: completed more than once. A duplicate is explained when one of its
executions overlaps a fault (it was in flight when the fault struck, so its
REPLY could not count), or when the scenario names it as in flight at a fault
(``in_flight``: e.g. a PZQ message sent and not yet answered when the broker was
killed, which its producer sends again); any other duplicate is a defect.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Verdict:
    accepted: int
    completed: int
    lost: list[str]
    unexpected: list[str]
    duplicates: dict[str, int]
    unexplained: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        return (
            f"accepted={self.accepted} completed={self.completed} lost={len(self.lost)} "
            f"unexpected={len(self.unexpected)} duplicated={len(self.duplicates)} "
            f"(unexplained {len(self.unexplained)})"
        )


class History:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.accepted: set[str] = set()
        self.faults: list[tuple[float, float]] = []  # (start, end) wall clock

    def accept(self, key: str) -> None:
        self.accepted.add(key)

    def fault(self, start: float, end: float | None = None) -> None:
        self.faults.append((start, start if end is None else end))

    def records(self, kind: str = "done") -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        lines = self.path.read_text().splitlines()
        return [r for r in map(json.loads, lines) if r["kind"] == kind]

    def completions(self) -> Counter[str]:
        return Counter(r["key"] for r in self.records())

    def verdict(self, window: float = 2.0, in_flight: frozenset[str] = frozenset()) -> Verdict:
        done = self.records()
        counts = Counter(r["key"] for r in done)
        duplicates = {k: n for k, n in counts.items() if n > 1}
        times: dict[str, list[float]] = defaultdict(list)
        for r in done:
            times[r["key"]].append(r["t"])
        unexplained = {
            key: n
            for key, n in duplicates.items()
            if key not in in_flight
            and not any(self._near_fault(t, window) for t in sorted(times[key])[:-1])
            and not any(self._near_fault(t, window) for t in sorted(times[key])[1:])
        }
        return Verdict(
            accepted=len(self.accepted),
            completed=len(counts),
            lost=sorted(self.accepted - set(counts)),
            unexpected=sorted(set(counts) - self.accepted),
            duplicates=duplicates,
            unexplained=unexplained,
        )

    def _near_fault(self, t: float, window: float) -> bool:
        return any(start - window <= t <= end + window for start, end in self.faults)


def report(name: str, verdict: Verdict) -> None:
    print(f"\n[{name}] {verdict.summary()}")
    if verdict.duplicates:
        print(f"[{name}] duplicated: {sorted(verdict.duplicates)[:20]}")


def assert_clean(verdict: Verdict) -> None:
    assert verdict.lost == [], f"lost: {verdict.lost[:20]} ({verdict.summary()})"
    assert verdict.unexpected == [], f"unexpected: {verdict.unexpected[:20]}"
    assert verdict.unexplained == {}, f"duplicates outside faults: {verdict.unexplained}"
