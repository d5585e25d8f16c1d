"""What OpenTelemetry costs emq when tracing is on (issue 35): drain throughput,
results and round trip with the SDK off and on, alternating in one run.

    .venv/bin/python bench/otel_cost.py [--tasks 10000] [--latency-tasks 500] \
        [--repeats 3] [--json bench/results/otel-<date>-<label>.json]

"off": the fair benchmark's emq setup as it is (``opentelemetry-api`` installed,
no tracer provider: every span is the API's no-op). "on": the producer and the
job manager's worker processes with the SDK's tracer provider and its batch span
processor (``bench/otel_settings.py``; the exporter drops the spans, so a
collector's cost is not counted): a PRODUCER span per ``delay()`` (one per
``map()`` call), a CONSUMER span per attempt. The broker makes no span either
way. Rounds alternate their order (``bench/alternate.py``).
"""

from __future__ import annotations

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from bench.alternate import alternate, options  # noqa: E402


def main(argv: list[str]) -> int:
    args = options(__doc__.split("\n\n")[0], argv)
    summary = alternate(
        ("off", "on"),
        lambda opts, mode: setattr(opts, "emq_otel", mode == "on"),
        args,
        "emq-otel-bench-",
    )
    cpu = summary["drain_cpu_us_per_task"]
    print(f"\ntracing on: {cpu['on'] - cpu['off']:+.1f} µs of CPU per no-op job")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
