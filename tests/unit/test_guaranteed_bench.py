"""bench/guaranteed_bench.py's arithmetic: nearest-rank percentiles of the ack
latencies, the medians and the line bench/summary.py writes for its results."""

from __future__ import annotations

from bench.guaranteed_bench import medians
from bench.guaranteed_clients import percentiles
from bench.summary import FIGURES


def test_percentiles_are_nearest_rank_in_milliseconds() -> None:
    samples = [i / 1000 for i in range(1, 101)]  # 1..100 ms, in any order
    got = percentiles(list(reversed(samples)))
    assert (got["p50_ms"], got["p90_ms"], got["p99_ms"], got["max_ms"]) == (50, 90, 99, 100)
    assert round(got["mean_ms"], 6) == 50.5
    assert percentiles([0.002])["p99_ms"] == 2.0


def test_medians_over_rounds_and_the_summary_line() -> None:
    def run(rate: float, p50: float) -> dict[str, object]:
        return {
            "jobs_per_s": rate,
            "confirmed_per_s": rate * 2,
            "ack": {"p50_ms": p50, "p99_ms": p50 * 3},
            "broker_cpu_us_per_job": 100.0,
            "consumers_cpu_us_per_job": 50.0,
        }

    med = medians([run(1000, 2.0), run(3000, 1.0), run(2000, 4.0)])
    assert (med["jobs_per_s"], med["ack_p50_ms"], med["ack_p99_ms"]) == (2000, 2.0, 6.0)
    doc = {
        "medians": {"emq-pg": med, "rabbitmq-qq": {**med, "jobs_per_s": 1000.0}},
        "ratios": {"emq-pg/rabbitmq-qq": {"jobs_per_s": 2.0}},
    }
    line = FIGURES["guaranteed"](doc)
    assert "emq-pg 2,000 jobs/s, ack p50 2.00 ms p99 6.00 ms" in line
    assert line.endswith("emq-pg/rabbitmq-qq 2.00x")
