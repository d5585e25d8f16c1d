"""Two settings of emq's fair-benchmark setup, alternating in one run: the shared
part of ``bench/curve_bench.py`` (CURVE off and on) and ``bench/otel_cost.py``
(OpenTelemetry's SDK off and on).

Each round runs ``bench/run.py``'s emq system once per mode, the order swapping
from round to round (so that a machine whose speed drifts affects both alike);
the figures are the medians over the rounds, and each mode's ratio to the first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench.run import parse_args, run_system, wait_for_quiet  # noqa: E402

FIGURES = ("drain_per_s", "results_per_s", "rtt_p50_ms", "rtt_p99_ms", "drain_cpu_us_per_task")


def options(description: str, argv: list[str]) -> argparse.Namespace:
    """The command line both benchmarks take."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--tasks", type=int, default=10000)
    ap.add_argument("--results-tasks", type=int, default=2000)
    ap.add_argument("--latency-tasks", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quiet-wait", type=float, default=10.0)
    ap.add_argument("--json", default="")
    return ap.parse_args(argv)


def alternate(
    modes: tuple[str, str],
    apply: Callable[[argparse.Namespace, str], None],
    args: argparse.Namespace,
    prefix: str,
) -> dict[str, Any]:
    """Run the emq system ``args.repeats`` times in each of ``modes`` (``apply``
    sets a mode on run.py's options); print and return every run, the medians
    and each figure's ratio second / first mode (also written to ``args.json``)."""
    log_dir = tempfile.mkdtemp(prefix=prefix)
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    for rnd in range(args.repeats):
        for mode in modes if rnd % 2 == 0 else modes[::-1]:
            opts = parse_args(
                ["--only", "emq", "--tasks", str(args.tasks),
                 "--results-tasks", str(args.results_tasks),
                 "--latency-tasks", str(args.latency_tasks)]
            )  # fmt: skip
            apply(opts, mode)
            wait_for_quiet(args.quiet_wait)
            started = time.monotonic()
            result = run_system("emq", opts, log_dir)
            result["loadavg"] = os.getloadavg()[0]
            runs[mode].append(result)
            shown = ", ".join(f"{k}={result.get(k, 0):.1f}" for k in FIGURES[:3])
            print(f"round {rnd + 1} {mode}: {shown} ({time.monotonic() - started:.0f} s)",
                  file=sys.stderr, flush=True)  # fmt: skip
    first, second = modes
    summary: dict[str, Any] = {"tasks": args.tasks, "repeats": args.repeats, "runs": runs}
    print(f"\nmedians of {args.repeats} rounds, {args.tasks} no-op jobs drained")
    print(f"{'figure':<24}{first:>12}{second:>12}{second + '/' + first:>14}")
    for figure in FIGURES:
        a = statistics.median(r[figure] for r in runs[first])
        b = statistics.median(r[figure] for r in runs[second])
        ratio = b / a if a else float("nan")
        summary[figure] = {first: a, second: b, "ratio": ratio}
        print(f"{figure:<24}{a:>12.1f}{b:>12.1f}{ratio:>14.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return summary
