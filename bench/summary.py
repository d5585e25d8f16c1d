"""The latest run of each benchmark, as one table: ``bench/results/SUMMARY.md``.

    .venv/bin/python bench/summary.py [--check]

Reads every ``bench/results/<benchmark>-<YYYY-MM-DD>-<label>.json``
(``bench/results_path.py``), takes the latest run of each benchmark (by the time
the file records, else its date), and writes its date, the machine's load average
as the file recorded it, and its headline figures. The fair benchmark's latest run
is the latest with every system (runs with ``--only`` are A/B comparisons).
``--check`` writes nothing and exits 1 when SUMMARY.md is not what it would write.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.report import ORDER  # noqa: E402
from bench.results_path import NAME, RESULTS  # noqa: E402

SUMMARY = RESULTS / "SUMMARY.md"


def recorded_time(doc: Any, date: str) -> str:
    """The run's time as the file says it (UTC), else the date of its name."""
    if isinstance(doc, dict):
        for key in ("timestamp", "when"):
            if key in doc:
                return str(doc[key]).replace("T", " ").removesuffix("+00:00")[:16]
        if "started" in doc:
            import datetime as dt

            started = dt.datetime.fromtimestamp(doc["started"], dt.UTC)
            return f"{started:%Y-%m-%d %H:%M}"
    return date


def _loads(value: Any) -> str:
    if isinstance(value, list | tuple) and value and all(isinstance(v, int | float) for v in value):
        return "/".join(f"{v:.1f}" for v in value[:3])
    return ""


def recorded_load(doc: Any) -> str:
    """The load average the file recorded (1/5/15 min), before -> after where both are."""
    if not isinstance(doc, dict):
        return "not recorded"
    machine = doc.get("machine", {})
    before = machine.get("loadavg_before") or doc.get("load_avg_before")
    after = machine.get("loadavg_after") or doc.get("load_avg_after")
    if before and after:
        return f"{_loads(before)} -> {_loads(after)}"
    for key in ("load", "loadavg", "load_average"):
        if key in doc and _loads(doc[key]):
            return _loads(doc[key])
    return "not recorded"


def _n(value: Any, digits: int = 0) -> str:
    return f"{value:,.{digits}f}" if isinstance(value, int | float) else str(value)


def fair_figures(doc: dict[str, Any]) -> str:
    results = doc["results"]
    emq = results.get("emq", {})
    parts = [
        f"emq {_n(emq.get('drain_per_s'))} no-op/s, {_n(emq.get('results_per_s'))} results/s, "
        f"p50 {_n(emq.get('rtt_p50_ms'), 2)} ms, p99 {_n(emq.get('rtt_p99_ms'), 2)} ms"
    ]
    ratios = doc.get("emq_vs_peers") or doc.get("emq_vs_best_peer") or {}
    for key, what in (("noop_throughput", "no-op"), ("results_throughput", "results")):
        if key in ratios:
            r = ratios[key]
            parts.append(f"{what} {r['emq_over_peer']:.2f}x {r['best_peer']}")
    return "; ".join(parts)


def per_system(table: dict[str, Any], keys: tuple[str, ...]) -> str:
    rows = []
    for system, figures in table.items():
        if isinstance(figures, dict):
            shown = ", ".join(
                f"{k} {_n(figures[k], 2 if k.endswith('_ms') else 0)}" for k in keys if k in figures
            )
            rows.append(f"{system}: {shown}")
        else:
            rows.append(f"{system}: {_n(figures)}")
    return "; ".join(rows)


def topics_figures(doc: dict[str, Any]) -> str:
    return per_system(doc["summary"], ("events_per_s", "p50_ms", "p99_ms"))


def mdp_figures(doc: dict[str, Any]) -> str:
    return per_system(doc["medians"], ("pipelined_per_s", "p50_ms", "p99_ms"))


def pzq_figures(doc: dict[str, Any]) -> str:
    return "messages/s " + per_system(doc["medians"], ())


def memory_figures(doc: dict[str, Any]) -> str:
    return (
        f"{_n(doc['jobs'])} {doc.get('kind', '')} jobs: {_n(doc['bytes_per_job'])} B/job queued, "
        f"peak {_n(doc['peak_rss'] / 1e6, 1)} MB, drained in {_n(doc['drain_seconds'], 1)} s"
    )


def guaranteed_figures(doc: dict[str, Any]) -> str:
    shown = [
        f"{system} {_n(m['jobs_per_s'])} jobs/s, ack p50 {_n(m['ack_p50_ms'], 2)} ms "
        f"p99 {_n(m['ack_p99_ms'], 2)} ms"
        for system, m in doc["medians"].items()
    ]
    shown += [f"{pair} {r['jobs_per_s']:.2f}x" for pair, r in doc.get("ratios", {}).items()]
    return "; ".join(shown)


def generic_figures(doc: Any) -> str:
    """The file's top-level numbers, and its medians one level down."""
    if not isinstance(doc, dict):
        return ""
    shown = [
        f"{k} {_n(v, 2 if isinstance(v, float) else 0)}"
        for k, v in doc.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    ]
    medians = doc.get("medians") or doc.get("median_us") or doc.get("drain_per_s")
    if isinstance(medians, dict):
        for k, v in medians.items():
            if isinstance(v, int | float):
                shown.append(f"{k} {_n(v, 2)}")
            elif isinstance(v, dict):
                inner = ", ".join(
                    f"{ik} {_n(iv, 2)}" for ik, iv in v.items() if isinstance(iv, int | float)
                )
                shown.append(f"{k}: {inner}")
    return "; ".join(shown[:8])


def workflows_figures(doc: dict[str, Any]) -> str:
    """emq's time per workflow, and how many times faster than each peer (at the
    size the ratio compares: the fallback's when the peer failed the full size)."""
    emq = doc["results"]["emq"]
    parts = []
    for kind, peers in doc["emq_vs_peers"].items():
        mine = emq[kind]
        shown = (
            f"{_n(mine['seconds'], 2)} s" if "seconds" in mine and "error" not in mine else "failed"
        )
        versus = ", ".join(
            f"{peer} {c['emq_faster_x']:.1f}x"
            + ("" if c["n"] == mine["n"] else f" at {_n(c['n'])}")
            for peer, c in peers.items()
        )
        parts.append(f"{kind} of {_n(mine['n'])}: emq {shown}; faster than {versus}")
    return "; ".join(parts)


FIGURES: dict[str, Callable[[dict[str, Any]], str]] = {
    "fair": fair_figures,
    "topics": topics_figures,
    "mdp": mdp_figures,
    "pzq": pzq_figures,
    "memory": memory_figures,
    "guaranteed": guaranteed_figures,
    "workflows": workflows_figures,
}


def is_full_fair_run(doc: Any) -> bool:
    return set(ORDER) <= set(doc.get("params", {}).get("systems", ()))


def latest_runs(results: Path = RESULTS) -> dict[str, tuple[Path, Any, str]]:
    """benchmark -> (path, document, recorded time) of its latest run."""
    latest: dict[str, tuple[Path, Any, str]] = {}
    for path in sorted(results.glob("*.json")):
        match = NAME.match(path.name)
        if not match:
            raise SystemExit(f"{path}: not named <benchmark>-<YYYY-MM-DD>-<label>.json")
        doc = json.loads(path.read_text())
        benchmark = match["benchmark"]
        if benchmark == "fair" and not is_full_fair_run(doc):
            continue
        when = recorded_time(doc, match["date"])
        if benchmark not in latest or (when, path.name) > (
            latest[benchmark][2],
            latest[benchmark][0].name,
        ):
            latest[benchmark] = (path, doc, when)
    return latest


def render(results: Path = RESULTS) -> str:
    lines = [
        "# Latest run of each benchmark",
        "",
        "Generated by `bench/summary.py` from `bench/results/` (do not edit): the latest",
        "run of each benchmark, when it ran (UTC), the machine's load average (1/5/15 min)",
        "as the run recorded it, and its headline figures. `bench/README.md` says what each",
        "measures; compare only figures of one run (the machines' speed varies 3-4x).",
        "",
        "| benchmark | run (UTC) | load average | file | headline figures |",
        "|---|---|---|---|---|",
    ]
    for benchmark, (path, doc, when) in sorted(latest_runs(results).items()):
        figures = FIGURES.get(benchmark, generic_figures)
        try:
            shown = figures(doc)
        except (KeyError, TypeError, AttributeError) as exc:
            shown = f"(unreadable here: {exc!r})"
        lines.append(f"| {benchmark} | {when} | {recorded_load(doc)} | `{path.name}` | {shown} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if SUMMARY.md is stale")
    opts = ap.parse_args()
    text = render()
    if opts.check:
        if not SUMMARY.exists() or SUMMARY.read_text() != text:
            print(f"{SUMMARY} is stale: run bench/summary.py", file=sys.stderr)
            return 1
        return 0
    SUMMARY.write_text(text)
    print(f"wrote {SUMMARY}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
