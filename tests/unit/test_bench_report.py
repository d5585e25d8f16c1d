"""The benchmark harness's pure parts: medians of repeats, ratios, the sink's request."""

import pytest

from bench.report import compare, cpu_ratios, median_of_runs, table
from bench.sink import parse_wait


def _run(drain: float, p50: float, producer: float) -> dict:
    return {
        "system": "x",
        "drain_per_s": drain,
        "results_per_s": drain / 2,
        "rtt_p50_ms": p50,
        "rtt_p99_ms": p50 * 3,
        "drain_cpu_us_per_task": producer + 20.0,
        "drain_cpu_us_per_task_by_role": {"producer": producer, "broker": 10.0, "workers": 10.0},
    }


def test_median_of_runs_takes_each_figure_and_nested_role_medians():
    runs = [_run(100.0, 1.0, 5.0), _run(300.0, 3.0, 50.0), _run(200.0, 9.0, 7.0)]
    med = median_of_runs(runs)
    assert med["drain_per_s"] == 200.0
    assert med["rtt_p50_ms"] == 3.0
    assert med["drain_cpu_us_per_task_by_role"]["producer"] == 7.0
    assert med["system"] == "x"


def test_median_of_runs_leaves_out_failed_runs_and_is_empty_when_all_failed():
    assert median_of_runs([_run(100.0, 1.0, 5.0), {"error": "boom"}])["drain_per_s"] == 100.0
    assert median_of_runs([{"error": "boom"}]) == {}


def test_compare_picks_the_best_peer_for_each_figure():
    results = {
        "emq": _run(400.0, 1.0, 20.0),
        "celery": _run(100.0, 4.0, 100.0),
        "huey": _run(200.0, 2.0, 100.0),
        "zmq": _run(1000.0, 0.5, 10.0),
    }
    cmp = compare(results)
    assert cmp["noop_throughput"]["best_peer"] == "huey"
    assert cmp["noop_throughput"]["emq_over_peer"] == pytest.approx(2.0)
    assert cmp["rtt_p50"]["best_peer"] == "huey"  # lowest latency wins
    assert cmp["rtt_p50"]["emq_over_peer"] == pytest.approx(0.5)
    assert cmp["rtt_p99_vs_forwarder"] == pytest.approx(2.0)  # the forwarder is no peer
    assert cmp["cpu_vs_forwarder"]["emq"]["producer"] == pytest.approx(2.0)
    assert cmp["cpu_vs_forwarder"]["emq"]["total"] == pytest.approx(40.0 / 30.0)


def test_cpu_ratios_need_the_reference():
    assert cpu_ratios({"emq": _run(1.0, 1.0, 1.0)}) == {}


def test_table_names_failed_systems():
    lines = table({"emq": _run(400.0, 1.0, 20.0)}, {"rq": "rq producer failed\nmore"})
    assert any(line.startswith("emq") for line in lines)
    assert any("rq producer failed" in line for line in lines)


def test_parse_wait_reads_target_and_milliseconds():
    assert parse_wait(b"WAIT 100 250") == (100, 250)


@pytest.mark.parametrize("request_", [b"", b"WAIT", b"COUNT 1 2", b"WAIT a 2"])
def test_parse_wait_rejects_anything_else(request_):
    with pytest.raises(ValueError):
        parse_wait(request_)
