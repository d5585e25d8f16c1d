"""What CURVE costs emq (issue 16): drain throughput and round trip with CURVE on
and off, alternating in one run.

    .venv/bin/python bench/curve_bench.py [--tasks 10000] [--latency-tasks 500] \
        [--repeats 3] [--json bench/results/curve-<date>-<label>.json]

Each round runs the same emq setup as ``bench/run.py`` (1 broker, 1 job manager
with 2 worker processes, the no-op and echo tasks, the completion sink) twice:
plain text, then CURVE on every socket with the ZAP allow-list (a broker key
pair, one registered key for the job manager and the producer); the next round
starts with CURVE (``bench/alternate.py``). The figures are the medians over the
rounds, and the ratio CURVE / plain text of each (issue 16 asks for CURVE drain
>= 70% of plain text).
"""

from __future__ import annotations

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench.alternate import alternate, options  # noqa: E402

REQUIRED_DRAIN_RATIO = 0.70


def main(argv: list[str]) -> int:
    args = options(__doc__.split("\n\n")[0], argv)
    summary = alternate(
        ("plain", "curve"),
        lambda opts, mode: setattr(opts, "emq_curve", mode == "curve"),
        args,
        "emq-curve-bench-",
    )
    drain = summary["drain_per_s"]["ratio"]
    verdict = "holds" if drain >= REQUIRED_DRAIN_RATIO else "does NOT hold"
    print(f"\nCURVE drain is {drain:.0%} of plain text: >= 70% {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
