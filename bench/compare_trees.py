"""The spine's drain rate and round trip in two source trees, in alternating pairs.

    .venv/bin/python bench/compare_trees.py BEFORE_DIR AFTER_DIR [--pairs 6] [--tasks 20000]
        [--json bench/results/<benchmark>-<date>-<label>.json]

Each pair runs ``bench/run.py --only emq`` of BEFORE_DIR, then of AFTER_DIR (each
tree's own code: run.py puts its tree first on PYTHONPATH), so that a machine
whose speed drifts affects both alike (e.g. a commit before a redesign and after
it, checked out as two git worktrees). Prints each pair, the medians, and
after/before ratios of the drain rate, the round trip p50 and the CPU per job
(``--json``: every run, with the CPU per job by role, and the medians).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any


def one_run(tree: str, tasks: int, latency_tasks: int) -> dict[str, Any]:
    python = os.path.join(tree, ".venv", "bin", "python")
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [
            python if os.path.exists(python) else sys.executable,
            os.path.join(tree, "bench", "run.py"),
            "--only",
            "emq",
            "--repeat",  # run.py takes --repeat, and since the fair benchmark --repeats
            "1",
            "--tasks",
            str(tasks),
            "--latency-tasks",
            str(latency_tasks),
            "--json",
            out.name,
        ]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=tree)
        result = json.load(open(out.name))["results"]["emq"]
    if "drain_per_s" not in result:
        raise SystemExit(f"the emq run in {tree} failed: {result}")
    return {
        "drain": result["drain_per_s"],
        "rtt_p50_ms": result["rtt_p50_ms"],
        # run.py's key before the fair benchmark, and after it
        "cpu": result.get("cpu_us_per_task", result.get("drain_cpu_us_per_task", 0.0)),
        "cpu_by_role": result.get("drain_cpu_us_per_task_by_role", {}),
        "results_per_s": result.get("results_per_s", 0.0),
        "loadavg": result.get("loadavg"),
        "other_load_cores": result.get("drain_other_load_cores"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--tasks", type=int, default=20000)
    ap.add_argument("--latency-tasks", type=int, default=1000)
    ap.add_argument("--json", help="write every run and the medians here")
    opts = ap.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    print("pair | before drain/s  rtt p50  µs/job | after drain/s  rtt p50  µs/job")
    for i in range(opts.pairs):
        a = one_run(opts.before, opts.tasks, opts.latency_tasks)
        b = one_run(opts.after, opts.tasks, opts.latency_tasks)
        runs["before"].append(a)
        runs["after"].append(b)
        print(
            f"{i + 1:4d} | {a['drain']:13,.0f} {a['rtt_p50_ms']:8.3f} {a['cpu']:7.0f} | "
            f"{b['drain']:12,.0f} {b['rtt_p50_ms']:8.3f} {b['cpu']:7.0f}",
            flush=True,
        )
    print("\nmedians            before      after  after/before")
    medians = {}
    roles = sorted({k for r in runs["before"] for k in r["cpu_by_role"]})
    for key in ("drain", "results_per_s", "rtt_p50_ms", "cpu", *roles):
        a = statistics.median(r[key] if key in r else r["cpu_by_role"][key] for r in runs["before"])
        b = statistics.median(r[key] if key in r else r["cpu_by_role"][key] for r in runs["after"])
        medians[key] = {"before": a, "after": b, "after_over_before": b / a if a else None}
        print(f"{key:12s} {a:12,.3f} {b:10,.3f} {b / a if a else 0:10.1%}")
    pair_ratios = sorted(
        b["drain"] / a["drain"] for a, b in zip(runs["before"], runs["after"], strict=True)
    )
    print(f"drain after/before of single pairs: {', '.join(f'{r:.1%}' for r in pair_ratios)}")
    if opts.json:
        doc = {
            "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "before": opts.before,
            "after": opts.after,
            "tasks": opts.tasks,
            "latency_tasks": opts.latency_tasks,
            "runs": runs,
            "medians": medians,
            "drain_pair_ratios": pair_ratios,
        }
        with open(opts.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
