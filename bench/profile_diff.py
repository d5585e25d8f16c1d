"""Python calls per job in cProfile stats of two or more source trees, side by side.

    .venv/bin/python bench/profile_diff.py JOBS BEFORE.prof[,MORE.prof] AFTER.prof[,...]

Each argument after JOBS is one tree's stats files (comma-separated: several runs,
or several processes, added up); JOBS is the number of jobs they ran in all. Prints
each tree's calls per job on the per-job path, then the functions whose calls per
job differ most from the first tree's. ``bench/broker_cpu.py --profile`` prints
the same for its brokers.

Why calls and not times: on a machine shared with other work, times move by tens of
percent from run to run, while the calls a job makes do not; a path that grew (a
new step per job, a batch that got smaller) shows as calls on a busy machine too.
Functions are named by file name and function (not by path and line), so that a
function moved to another module of the same name, or within its file, matches.
The per-job path: the functions called at least once per ``PER_JOB`` jobs (start-up
imports and rare timers are left out of the totals; they still show in the
differences when they differ).
"""

from __future__ import annotations

import os
import pstats
import re
import sys
from collections import Counter

PER_JOB = 10  # a function called at least once per PER_JOB jobs is on the per-job path
TOP = 25
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def calls(files: list[str]) -> Counter[str]:
    """Calls by ``file name:function`` over ``files`` (cProfile stats)."""
    out: Counter[str] = Counter()
    for f in files:
        stats: dict[tuple[str, int, str], tuple[int, int, float, float, object]]
        stats = pstats.Stats(f).stats  # type: ignore[attr-defined]
        for (path, _line, func), (_cc, ncalls, _tt, _ct, _callers) in stats.items():
            func = _ADDRESS.sub("", func)  # a built-in type's __new__ names its address
            out[f"{os.path.basename(path)}:{func}"] += ncalls
    return out


def report(trees: dict[str, list[str]], jobs: int) -> list[str]:
    """Lines: each tree's calls per job on the per-job path, then the functions whose
    calls per job differ most from the first tree's."""
    counted = {tree: calls(files) for tree, files in trees.items()}
    lines = []
    for tree, c in counted.items():
        on_path = sum(n for n in c.values() if n * PER_JOB >= jobs)
        lines.append(f"{tree}: {on_path / jobs:.1f} Python calls per job on the per-job path")
    names = list(counted)
    first = counted[names[0]]
    for tree in names[1:]:
        c = counted[tree]
        diffs = sorted(set(first) | set(c), key=lambda k: -abs(c[k] - first[k]))
        lines.append(f"calls per job, {names[0]} -> {tree} (largest differences):")
        for k in diffs[:TOP]:
            if abs(c[k] - first[k]) * PER_JOB < jobs:
                break
            lines.append(f"  {first[k] / jobs:8.3f} {c[k] / jobs:8.3f} {k}")
    return lines


def main(argv: list[str]) -> None:
    if len(argv) < 3:
        raise SystemExit(__doc__)
    jobs = int(argv[0])
    trees = {arg: arg.split(",") for arg in argv[1:]}
    print("\n".join(report(trees, jobs)))


if __name__ == "__main__":
    main(sys.argv[1:])
