"""What keeping its answers in the slot table costs a worker process, per answer.

    .venv/bin/python bench/slot_ring_cost.py [--n 200000] [--rounds 5] [--json PATH]

Times ``SlotTable.sent`` (every answer, kept before it leaves, so that the job
manager sends it again if the process dies), ``hold`` + ``release`` (an answer held
back for a batched REPLY) and, for scale, encoding the REPLY itself. Rounds
alternate the three; the median of the rounds is printed, in µs per call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import timeit
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from emq_django.protocol import frames as F  # noqa: E402
from emq_django.worker.slots import SlotTable  # noqa: E402

REF = b"447331145ee4de6dfb98742a06ae1b6a#1"
STATUS = b"ok,ready"
BODY = b'{"value": 3}'


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    opts = ap.parse_args()
    table = SlotTable(2, recent=200)
    cases: dict[str, Callable[[], object]] = {
        "sent": lambda: table.sent(1, REF, STATUS, BODY, time.monotonic()),
        "hold_release": lambda: table.hold(1, REF, STATUS, BODY) or table.release(1),
        "encode_reply": lambda: F.encode_reply(b"m-1", BODY, REF, STATUS),
    }
    rounds: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(opts.rounds):
        for name, fn in cases.items():
            rounds[name].append(timeit.timeit(fn, number=opts.n) / opts.n * 1e6)
    medians = {k: statistics.median(v) for k, v in rounds.items()}
    for name, us in medians.items():
        print(f"{name:14s} {us:7.3f} µs per call")
    if opts.json:
        doc = {
            "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "loadavg": os.getloadavg(),
            "n": opts.n,
            "rounds_us": rounds,
            "median_us": medians,
        }
        with open(opts.json, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
