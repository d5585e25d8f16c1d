"""What CURVE costs emq (issue 16): drain throughput and round trip with CURVE on
and off, alternating in one run.

    .venv/bin/python bench/curve_bench.py [--tasks 10000] [--latency-tasks 500] \
        [--repeats 3] [--json bench/results/curve-<date>-<label>.json]

Each round runs the same emq setup as ``bench/run.py`` (1 broker, 1 job manager
with 2 worker processes, the no-op and echo tasks, the completion sink) twice:
plain text, then CURVE on every socket with the ZAP allow-list (a broker key
pair, one registered key for the job manager and the producer); the next round
starts with CURVE. The figures are the medians over the rounds, and the ratio
CURVE / plain text of each (issue 16 asks for CURVE drain >= 70% of plain text).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench.run import parse_args, run_system, wait_for_quiet  # noqa: E402

FIGURES = ("drain_per_s", "results_per_s", "rtt_p50_ms", "rtt_p99_ms", "drain_cpu_us_per_task")
REQUIRED_DRAIN_RATIO = 0.70


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=10000)
    ap.add_argument("--results-tasks", type=int, default=2000)
    ap.add_argument("--latency-tasks", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quiet-wait", type=float, default=10.0)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    log_dir = tempfile.mkdtemp(prefix="emq-curve-bench-")
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "curve": []}
    for rnd in range(args.repeats):
        order = ["plain", "curve"] if rnd % 2 == 0 else ["curve", "plain"]
        for mode in order:
            opts = parse_args(
                [
                    "--only",
                    "emq",
                    "--tasks",
                    str(args.tasks),
                    "--results-tasks",
                    str(args.results_tasks),
                    "--latency-tasks",
                    str(args.latency_tasks),
                ]
            )
            opts.emq_curve = mode == "curve"
            wait_for_quiet(args.quiet_wait)
            started = time.monotonic()
            result = run_system("emq", opts, log_dir)
            result["loadavg"] = os.getloadavg()[0]
            runs[mode].append(result)
            shown = ", ".join(f"{k}={result.get(k, 0):.1f}" for k in FIGURES[:3])
            print(
                f"round {rnd + 1} {mode}: {shown} ({time.monotonic() - started:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
    summary: dict[str, Any] = {"tasks": args.tasks, "repeats": args.repeats, "runs": runs}
    print(f"\nmedians of {args.repeats} rounds, {args.tasks} no-op jobs drained")
    print(f"{'figure':<24}{'plain':>12}{'curve':>12}{'curve/plain':>14}")
    for figure in FIGURES:
        plain = statistics.median(r[figure] for r in runs["plain"])
        curve = statistics.median(r[figure] for r in runs["curve"])
        ratio = curve / plain if plain else float("nan")
        summary[figure] = {"plain": plain, "curve": curve, "ratio": ratio}
        print(f"{figure:<24}{plain:>12.1f}{curve:>12.1f}{ratio:>14.2f}")
    drain = summary["drain_per_s"]["ratio"]
    verdict = "holds" if drain >= REQUIRED_DRAIN_RATIO else "does NOT hold"
    print(f"\nCURVE drain is {drain:.0%} of plain text: >= 70% {verdict}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
