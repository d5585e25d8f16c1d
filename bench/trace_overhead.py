"""What the trace log and the job history cost: emq with them off, then on, in turns.

    .venv/bin/python bench/trace_overhead.py [--pairs 4] [--tasks 20000]

Each pair runs ``bench/run.py --only emq`` once without and once with
``--emq-trace`` (trace log + ``DatabaseRecorder`` on a fresh SQLite database),
so that a machine whose speed drifts during the run (a shared 2-core VM does)
affects both sides alike. ``BENCH_EMQ_TRACE_PARTS=trace`` (or ``recorder``)
turns on only one of the two. Prints every pair, then the medians and the ratio
on/off of the drain rate and of the CPU per task, and how the pairs' own ratios
spread (a busy 2-core machine's runs vary by more than the effect measured).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def one_run(tasks: int, trace: bool) -> dict[str, float]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [
            sys.executable,
            os.path.join(HERE, "run.py"),
            "--only",
            "emq",
            "--repeats",
            "1",
            "--results-tasks",
            "0",
            "--latency-tasks",
            "0",
            "--quiet-wait",
            "20",
            "--tasks",
            str(tasks),
            "--json",
            out.name,
        ]
        if trace:
            cmd.append("--emq-trace")
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        result = json.load(open(out.name))["results"]["emq"]
    if "drain_per_s" not in result:
        raise SystemExit(f"the emq run failed: {result}")
    return {
        "drain": result["drain_per_s"],
        "cpu": result["drain_cpu_us_per_task"],
        **{f"cpu_{k}": v for k, v in result["drain_cpu_us_per_task_by_role"].items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--tasks", type=int, default=20000)
    opts = ap.parse_args()
    off: list[dict[str, float]] = []
    on: list[dict[str, float]] = []
    print("pair |  off drain/s  µs/task |   on drain/s  µs/task | on/off drain")
    for i in range(opts.pairs):
        a, b = one_run(opts.tasks, False), one_run(opts.tasks, True)
        off.append(a)
        on.append(b)
        print(
            f"{i + 1:4d} | {a['drain']:12,.0f} {a['cpu']:8.0f} | {b['drain']:12,.0f} "
            f"{b['cpu']:8.0f} | {b['drain'] / a['drain']:6.1%}",
            flush=True,
        )

    def med(runs: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in runs)

    print("\nmedians          off        on     on/off")
    for key in ["drain", "cpu"] + sorted(k for k in off[0] if k.startswith("cpu_")):
        a, b = med(off, key), med(on, key)
        print(f"{key:12s} {a:10,.1f} {b:9,.1f} {b / a:9.1%}")
    ratios = sorted(b["drain"] / a["drain"] for a, b in zip(off, on, strict=True))
    if len(ratios) >= 4:
        q1, q2, q3 = statistics.quantiles(ratios, n=4)
        print(
            f"\non/off drain of single pairs: median {q2:.1%}, quartiles {q1:.1%} - {q3:.1%}, "
            f"range {ratios[0]:.1%} - {ratios[-1]:.1%}"
        )


if __name__ == "__main__":
    main()
