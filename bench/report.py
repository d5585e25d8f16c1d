"""Pure parts of the harness: medians of repeats, ratios, the printed tables."""

from __future__ import annotations

import statistics
from typing import Any

ORDER = ["emq", "celery", "dramatiq-1t", "dramatiq-8t", "huey", "rq", "zmq"]
PEERS = ["celery", "dramatiq-1t", "dramatiq-8t", "huey", "rq"]
REFERENCE = "zmq"
ROLES = ["producer", "broker", "workers"]


def median_of_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each number over the runs (and of each number in a nested dict);
    other values are taken from the first run. Runs with an ``error`` are left out."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return {}
    out: dict[str, Any] = {}
    for key, value in ok[0].items():
        if isinstance(value, bool) or not isinstance(value, (int, float, dict)):
            out[key] = value
        elif isinstance(value, dict):
            out[key] = median_of_runs([r[key] for r in ok if isinstance(r.get(key), dict)])
        else:
            nums = [r[key] for r in ok if isinstance(r.get(key), (int, float))]
            out[key] = statistics.median(nums)
    return out


def _best(
    results: dict[str, dict[str, Any]], key: str, names: list[str], lowest: bool = False
) -> tuple[str, float] | None:
    have = {
        n: results[n][key] for n in names if isinstance(results.get(n, {}).get(key), (int, float))
    }
    if not have:
        return None
    name = (min if lowest else max)(have, key=lambda n: have[n])
    return name, have[name]


def cpu_ratios(results: dict[str, dict[str, Any]], phase: str = "drain") -> dict[str, Any]:
    """Each system's CPU µs per job, by role and in total, over the reference's."""
    ref = results.get(REFERENCE, {}).get(f"{phase}_cpu_us_per_task_by_role")
    if not ref:
        return {}
    out: dict[str, Any] = {}
    for name, r in results.items():
        mine = r.get(f"{phase}_cpu_us_per_task_by_role")
        if not mine:
            continue
        ratios = {role: mine.get(role, 0.0) / ref[role] for role in ROLES if ref.get(role)}
        ratios["total"] = sum(mine.values()) / sum(ref.values())
        out[name] = ratios
    return out


def compare(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """emq against the best peer and the raw forwarder (the figures issue 18 asks for)."""
    emq = results.get("emq", {})
    out: dict[str, Any] = {}
    for label, key, lowest in [
        ("noop_throughput", "drain_per_s", False),
        ("results_throughput", "results_per_s", False),
        ("rtt_p50", "rtt_p50_ms", True),
    ]:
        best = _best(results, key, PEERS, lowest)
        if best and isinstance(emq.get(key), (int, float)):
            out[label] = {
                "best_peer": best[0],
                "peer": best[1],
                "emq": emq[key],
                "emq_over_peer": emq[key] / best[1],
            }
    ref = results.get(REFERENCE, {})
    if isinstance(emq.get("rtt_p99_ms"), float) and isinstance(ref.get("rtt_p99_ms"), float):
        out["rtt_p99_vs_forwarder"] = emq["rtt_p99_ms"] / ref["rtt_p99_ms"]
    out["cpu_vs_forwarder"] = cpu_ratios(results)
    return out


def fmt(v: Any, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def table(results: dict[str, dict[str, Any]], errors: dict[str, str]) -> list[str]:
    """The main table: throughput, latency, CPU per job by role and ratio to zmq."""
    ratios = cpu_ratios(results)
    head = (
        f"{'system':<11} | {'no-op/s':>7} | {'results/s':>9} | {'p50 ms':>6} | {'p99 ms':>6} | "
        f"{'CPU µs/job prod/brok/work = total':>33} | {'x forwarder prod/brok/work (total)':>34}"
    )
    lines = [head, "-" * len(head)]
    for name in ORDER:
        if name in errors and name not in results:
            lines.append(f"{name:<11} | failed: {errors[name].splitlines()[0][:90]}")
            continue
        r = results.get(name)
        if not r:
            continue
        role = r.get("drain_cpu_us_per_task_by_role", {})
        cpu = "/".join(fmt(role.get(k), ".0f") for k in ROLES)
        cpu += f" = {fmt(r.get('drain_cpu_us_per_task'), '.0f')}"
        x = ratios.get(name, {})
        xs = "/".join(fmt(x.get(k), ".1f") for k in ROLES) + f" ({fmt(x.get('total'), '.1f')})"
        lines.append(
            f"{name:<11} | {fmt(r.get('drain_per_s'), '7,.0f')} | "
            f"{fmt(r.get('results_per_s'), '9,.0f')} | {fmt(r.get('rtt_p50_ms'), '6.2f')} | "
            f"{fmt(r.get('rtt_p99_ms'), '6.2f')} | {cpu:>33} | {xs:>34}"
        )
    return lines


def summary(cmp: dict[str, Any]) -> list[str]:
    lines = []
    names = {
        "noop_throughput": "no-op throughput",
        "results_throughput": "results throughput",
        "rtt_p50": "round-trip p50",
    }
    for key, label in names.items():
        c = cmp.get(key)
        if c:
            lines.append(
                f"emq {label}: {c['emq']:,.2f} vs best peer {c['best_peer']} {c['peer']:,.2f}"
                f" -> {c['emq_over_peer']:.2f}x"
            )
    if "rtt_p99_vs_forwarder" in cmp:
        lines.append(f"emq round-trip p99 / raw forwarder's: {cmp['rtt_p99_vs_forwarder']:.2f}x")
    emq = cmp.get("cpu_vs_forwarder", {}).get("emq")
    if emq:
        parts = ", ".join(f"{k} {v:.1f}x" for k, v in emq.items())
        lines.append(f"emq CPU per no-op job / raw forwarder's: {parts}")
    return lines
