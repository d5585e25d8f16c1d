"""Workflows against Celery's canvas and Dramatiq's composition (issue 34), in one run.

    .venv/bin/python bench/workflow_bench.py [--chord 10000] [--chain 1000]
        [--chord-fallback 1000] [--chain-fallback 400] [--limit 600]
        [--only emq,celery,dramatiq-1t] [--json bench/results/workflows-<date>-<label>.json]

- chord: ``--chord`` no-op members and a callback that gets their results; the
  clock runs from the producer's first signature to the callback's result in the
  producer;
- chain: ``--chain`` steps, each adding one to the previous step's result; the
  clock ends when the final result reaches the producer.

Each measurement gets its servers fresh, started as bench/run.py starts them
(bench/systems.py: 2 worker processes each; RabbitMQ and Redis for the peers,
Redis as their result backend), and a producer process of its own
(bench/workflow_clients.py) that warms up, then times one workflow. A peer that
fails at the full size, or does not finish within ``--limit`` seconds, is
measured again at the fallback size, and emq with it, so that each ratio
compares one size. See bench/README.md ("Workflows").
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.procs import PYTHON, REPO, ServerSet  # noqa: E402
from bench.results_path import result_path  # noqa: E402
from bench.run import machine_info, wait_for_quiet  # noqa: E402
from bench.run import parse_args as fair_args  # noqa: E402
from bench.systems import CLIENT, STARTERS  # noqa: E402

SYSTEMS = ("emq", "celery", "dramatiq-1t", "dramatiq-8t")
KINDS = ("chord", "chain")
# issue 34: emq's chord at least 5x faster than each peer's, its chain at least 3x
TARGETS = {"chord": 5.0, "chain": 3.0}


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--chord", type=int, default=10_000, help="members of the chord")
    ap.add_argument("--chain", type=int, default=1_000, help="steps of the chain")
    ap.add_argument("--chord-fallback", type=int, default=1_000, help="0: none")
    ap.add_argument(
        "--chain-fallback", type=int, default=400, help="0: none; the size if a peer fails 1,000"
    )
    ap.add_argument(
        "--limit",
        type=float,
        default=600.0,
        help="seconds a workflow may take before it counts as failed",
    )
    ap.add_argument("--only", default="emq,celery,dramatiq-1t", help="of " + ",".join(SYSTEMS))
    ap.add_argument(
        "--quiet-wait",
        type=float,
        default=10.0,
        help="seconds to wait for other load to drop below 0.25 cores before each measurement",
    )
    ap.add_argument("--json", default=str(result_path("workflows")))
    ap.add_argument("--keep-logs", action="store_true", help="print where server logs are kept")
    opts = ap.parse_args(argv)
    opts.systems = [s.strip() for s in opts.only.split(",") if s.strip()]
    unknown = set(opts.systems) - set(SYSTEMS)
    if unknown or "emq" not in opts.systems:
        ap.error(f"--only: emq and any of {SYSTEMS[1:]} (unknown: {sorted(unknown)})")
    return opts


def measure(
    system: str, kind: str, n: int, opts: argparse.Namespace, log_dir: str
) -> dict[str, Any]:
    """Fresh servers for ``system``, one producer process timing one workflow."""
    idle = wait_for_quiet(opts.quiet_wait)
    servers = ServerSet(os.path.join(log_dir, f"{system}-{kind}-{n}"))
    fair = fair_args([])  # bench/run.py's defaults: prefetch, backends, concurrency
    fair.done_url = "tcp://127.0.0.1:1"  # no workflow task signals the sink
    try:
        started = STARTERS[system](servers, fair)
        argv = [PYTHON, "-m", "bench.workflow_clients", CLIENT[system]]
        argv += ["--kind", kind, "--n", str(n), "--limit", str(opts.limit)]
        for role, pids in started.roles.items():
            argv += [f"--pid={role}:{pid}" for pid in pids]
        try:
            done = subprocess.run(
                argv, cwd=REPO, env=started.env, capture_output=True, timeout=opts.limit + 300
            )
        except subprocess.TimeoutExpired:  # run() has killed it
            return {"n": n, "error": f"the producer did not exit within {opts.limit + 300:.0f} s"}
        out = done.stdout.decode(errors="replace").strip()
        if done.returncode != 0 or not out:
            dead = [s.name for s in servers.servers if not s.alive()]
            tails = "\n".join(f"--- {s.name}:\n{s.log_tail(15)}" for s in servers.servers)
            err = done.stderr.decode(errors="replace")[-2000:]
            return {
                "n": n,
                "error": f"producer rc={done.returncode}; dead: {dead}\n{err}\n{tails}"[:4000],
            }
        result: dict[str, Any] = json.loads(out.splitlines()[-1])
        result["setup"] = started.notes
        result["other_load_cores_before"] = idle
        result["loadavg_after"] = os.getloadavg()[0]
        return result
    finally:
        servers.stop_all()


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per kind and peer: the peer's seconds over emq's, at the full size when the
    peer managed it, else at the fallback size."""
    out: dict[str, dict[str, Any]] = {}
    emq = results["emq"]
    for kind in KINDS:
        for peer, rs in results.items():
            if peer == "emq":
                continue
            for key in (kind, f"{kind}_fallback"):
                mine, theirs = emq.get(key, {}), rs.get(key, {})
                if "per_s" in mine and "per_s" in theirs and mine["n"] == theirs["n"]:
                    ratio = theirs["seconds"] / mine["seconds"]
                    out.setdefault(kind, {})[peer] = {
                        "n": mine["n"],
                        "emq_faster_x": ratio,
                        "target_x": TARGETS[kind],
                        "met": ratio >= TARGETS[kind],
                    }
                    break
    return out


def table(opts: argparse.Namespace, results: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        "| system | workflow | n | seconds | steps/s | CPU µs/step prod/broker/workers |",
        "|---|---|---:|---:|---:|---|",
    ]
    for system in opts.systems:
        for key in (*KINDS, *(f"{k}_fallback" for k in KINDS)):
            r = results[system].get(key)
            if r is None:
                continue
            if "error" in r:
                first = r["error"].splitlines()[0][:100]
                lines.append(f"| {system} | {key} | {r['n']:,} | failed: {first} | | |")
                continue
            role = r["cpu_us_per_step_by_role"]
            cpu = "/".join(f"{role.get(k, 0):,.0f}" for k in ("producer", "broker", "workers"))
            lines.append(
                f"| {system} | {key} | {r['n']:,} | {r['seconds']:,.2f} | {r['per_s']:,.0f} "
                f"| {cpu} |"
            )
    return lines


def main(argv: list[str]) -> int:
    opts = parse_args(argv)
    # Dramatiq's group callbacks (bench/dramatiq_app.py), in its workers and producer
    os.environ["BENCH_DRAMATIQ_GROUPS"] = "1"
    info = machine_info()
    log_dir = tempfile.mkdtemp(prefix="emq-wfbench-")
    results: dict[str, dict[str, Any]] = {s: {} for s in opts.systems}
    sizes = {"chord": (opts.chord, opts.chord_fallback), "chain": (opts.chain, opts.chain_fallback)}
    for kind in KINDS:
        n, fallback = sizes[kind]
        for system in opts.systems:
            t = time.monotonic()
            print(f"{system}: {kind} of {n:,} ...", file=sys.stderr, flush=True)
            results[system][kind] = r = measure(system, kind, n, opts, log_dir)
            shown = r["error"].splitlines()[0] if "error" in r else f"{r['seconds']:.2f} s"
            print(f"  {shown} ({time.monotonic() - t:.0f} s with start-up)", file=sys.stderr)
        failed = [s for s in opts.systems if "error" in results[s][kind]]
        if failed and fallback and fallback < n:
            for system in sorted({"emq", *failed}, key=opts.systems.index):
                print(f"{system}: {kind} of {fallback:,} ...", file=sys.stderr, flush=True)
                r = measure(system, kind, fallback, opts, log_dir)
                results[system][f"{kind}_fallback"] = r
    info["loadavg_after"] = os.getloadavg()
    cmp = ratios(results)
    print("\n".join(table(opts, results)))
    for kind, peers in cmp.items():
        for peer, c in peers.items():
            verdict = "met" if c["met"] else "NOT met"
            print(
                f"{kind} of {c['n']:,}: emq {c['emq_faster_x']:.1f}x faster than {peer} "
                f"(target {c['target_x']:.0f}x: {verdict})"
            )
    doc = {
        "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "params": {k: v for k, v in vars(opts).items() if k not in ("json", "keep_logs")},
        "machine": info,
        "results": results,
        "emq_vs_peers": cmp,
    }
    with open(opts.json, "w") as f:
        json.dump(doc, f, indent=2)
    print(f"results written to {opts.json}")
    if opts.keep_logs:
        print(f"server logs in {log_dir}")
    return 1 if any("error" in r for r in results["emq"].values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
