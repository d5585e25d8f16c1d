"""Names shared by the trace readers, the transforms and the synthetic traces."""

from __future__ import annotations

import re

TRACE_FILE_RE = re.compile(r"^trace-(\d{8})-(\d{2})\.jsonl$")

ENQUEUED = "enqueued"
DISPATCHED = "dispatched"
SUCCEEDED = "succeeded"
FAILED = "failed"
TIMED_OUT = "timed_out"
REQUEUED = "requeued"
RETRIED = "retried"
DEAD_LETTERED = "dead_lettered"

# The events that end an attempt (they carry run_us and total_us).
FINISH_EVENTS = (SUCCEEDED, FAILED, TIMED_OUT)
# A job whose last event is one of these has its final outcome.
FINAL_EVENTS = (SUCCEEDED, FAILED, TIMED_OUT, DEAD_LETTERED)

# Order of events that share a timestamp (one broker loop turn): a failure comes
# before the retry or dead letter that it causes.
EVENT_RANK = {
    ENQUEUED: 0,
    DISPATCHED: 1,
    REQUEUED: 2,
    SUCCEEDED: 3,
    FAILED: 3,
    TIMED_OUT: 3,
    RETRIED: 4,
    DEAD_LETTERED: 5,
}

# A line's time must be in [0, MAX_US) µs since the epoch (1970 to 2112-09-17: the
# full path packs it into 52 bits) and a duration (run_us, total_us, wait_us,
# delay_us) within (-MAX_US, MAX_US), so that no sum or difference of them
# overflows a long: a line with another time is dropped as malformed, another
# duration is null.
MAX_US = 1 << 52
DURATIONS = ("wait_us", "run_us", "total_us", "delay_us")

PERCENTILES = (0.5, 0.95, 0.99)
# Percentiles come from KLL sketches (Apache DataSketches, Spark's
# kll_sketch_agg_bigint) of PERCENTILE_SKETCH_K items: the value returned for
# percentile p of a group of n values is one of those values; for n up to
# PERCENTILE_SKETCH_K (every queue x task x minute below about 270 jobs/s) the sketch
# keeps them all and returns the value of rank ceil(p * n) itself; beyond, its rank is
# within n / PERCENTILE_ACCURACY of p * n (KLL's rank error for this k is about
# 0.013% of n, 99% of the time; the bound stated here is 0.02%). A sketch costs a
# fraction of a percentile_approx digest per value (bench/README.md, session 25).
PERCENTILE_SKETCH_K = 16_384
PERCENTILE_ACCURACY = 5_000
PERCENTILE_NAMES = ("p50", "p95", "p99")
LATENCIES = ("wait", "run", "e2e")
