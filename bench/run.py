"""Benchmark emq against Celery, Dramatiq, Huey, RQ and a raw ZeroMQ forwarder.

    .venv/bin/python bench/run.py [--tasks 10000] [--results-tasks 10000]
        [--latency-tasks 1000] [--repeats 3]
        [--only emq,celery,dramatiq-1t,dramatiq-8t,huey,rq,zmq]
        [--json bench/results/fair-<date>-<label>.json]

See bench/README.md for what is measured and how.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.procs import PYTHON, REPO, ServerSet, base_env, free_port  # noqa: E402
from bench.report import ORDER, compare, median_of_runs, summary, table  # noqa: E402
from bench.results_path import result_path  # noqa: E402
from bench.systems import CLIENT, STARTERS, emq_available  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tasks", type=int, default=10000, help="no-op jobs sent and drained")
    ap.add_argument(
        "--results-tasks",
        type=int,
        default=None,
        help="echo jobs sent, then every result fetched (default: --tasks; 0 skips)",
    )
    ap.add_argument("--latency-tasks", type=int, default=1000, help="sequential round trips timed")
    ap.add_argument("--latency-warmup", type=int, default=100)
    ap.add_argument(
        "--only", default=",".join(ORDER), help="comma-separated subset of " + ",".join(ORDER)
    )
    ap.add_argument(
        "--json",
        default=str(result_path("fair")),
        help="default bench/results/fair-<UTC date>-<UTC time>.json (bench/results_path.py)",
    )
    ap.add_argument("--celery-backend", choices=["redis", "rpc"], default="redis")
    ap.add_argument("--celery-prefetch", type=int, default=64)
    ap.add_argument("--celery-optimization", choices=["default", "fair"], default="default")
    ap.add_argument(
        "--dramatiq-prefetch", type=int, default=64, help="0: Dramatiq's default (2 x threads)"
    )
    ap.add_argument("--zmq-credit", type=int, default=100, help="READY credits per zmq worker")
    ap.add_argument(
        "--repeats",
        "--repeat",
        type=int,
        default=3,
        help="run every system N times (round-robin); each figure is the median",
    )
    ap.add_argument(
        "--quiet-wait",
        type=float,
        default=30.0,
        help="seconds to wait for other load to drop below 0.25 cores before each system",
    )
    ap.add_argument(
        "--emq-trace",
        action="store_true",
        help="emq with its trace log (EMQ_TRACE_DIR) and the job history recorder "
        "(EMQ_RECORDER=DatabaseRecorder, a fresh SQLite database) on; off otherwise",
    )
    ap.add_argument(
        "--emq-curve",
        action="store_true",
        help="emq with CURVE on every socket and the ZAP allow-list (bench/curve_bench.py "
        "alternates it with plain text)",
    )
    ap.add_argument(
        "--emq-otel",
        action="store_true",
        help="emq's producer and job manager with OpenTelemetry's SDK on (bench/otel_settings.py:"
        " a batch span processor, spans dropped); off otherwise (the API installed, no provider)",
    )
    ap.add_argument("--keep-logs", action="store_true", help="print where server logs are kept")
    opts = ap.parse_args(argv)
    if opts.results_tasks is None:
        opts.results_tasks = opts.tasks
    opts.systems = [s.strip() for s in opts.only.split(",") if s.strip()]
    unknown = set(opts.systems) - set(ORDER)
    if unknown:
        ap.error(f"unknown systems {sorted(unknown)}; choose from {ORDER}")
    return opts


def start_sink(servers: ServerSet) -> tuple[str, str]:
    """The completion sink (bench/sink.py): (the URL tasks PUSH to, its control URL)."""
    pull, control = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    servers.start("sink", "harness", [PYTHON, "-m", "bench.sink", pull, control], base_env())
    return pull, control


def run_system(name: str, opts: argparse.Namespace, log_dir: str) -> dict[str, Any]:
    servers = ServerSet(os.path.join(log_dir, name))
    client: subprocess.Popen[bytes] | None = None
    try:
        opts.done_url, control = start_sink(servers)
        started = STARTERS[name](servers, opts)
        argv = [
            PYTHON,
            "-m",
            "bench.clients",
            CLIENT[name],
            "--tasks",
            str(opts.tasks),
            "--results-tasks",
            str(opts.results_tasks),
            "--latency-tasks",
            str(opts.latency_tasks),
            "--latency-warmup",
            str(opts.latency_warmup),
            "--endpoint",
            started.endpoint,
            "--sink",
            control,
            f"--pid=harness:{servers.servers[0].pid}",
        ]
        for role, pids in started.roles.items():
            argv += [f"--pid={role}:{pid}" for pid in pids]
        client = subprocess.Popen(
            argv,
            cwd=REPO,
            env=started.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        out, err = client.communicate(timeout=1800)
        dead = [s.name for s in servers.servers if not s.alive()]
        if client.returncode != 0 or not out.strip():
            tails = "\n".join(f"--- {s.name} log:\n{s.log_tail()}" for s in servers.servers)
            raise RuntimeError(
                f"{name} producer failed (rc={client.returncode}); dead servers: {dead}\n"
                f"{err.decode(errors='replace')[-3000:]}\n{tails}"
            )
        result = json.loads(out.strip().splitlines()[-1])
        result["system"] = name
        result["setup"] = started.notes
        return result
    finally:
        if client is not None and client.poll() is None:
            _stop_pid(client)
        servers.stop_all()


def _stop_pid(p: subprocess.Popen[bytes]) -> None:
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(timeout=5)


def machine_busy_cores(interval: float = 1.0) -> float:
    """Busy cores on the whole machine over the interval (we run nothing meanwhile)."""
    import psutil

    def busy() -> float:
        t = psutil.cpu_times()
        return (
            sum(t)
            - t.idle
            - getattr(t, "iowait", 0.0)
            - getattr(t, "guest", 0.0)
            - getattr(t, "guest_nice", 0.0)
        )

    b0, t0 = busy(), time.monotonic()
    time.sleep(interval)
    return (busy() - b0) / (time.monotonic() - t0)


def wait_for_quiet(limit: float, threshold: float = 0.25) -> float:
    deadline = time.monotonic() + limit
    load = machine_busy_cores()
    while load > threshold and time.monotonic() < deadline:
        print(
            f"  machine busy ({load:.2f} cores used by others); waiting",
            file=sys.stderr,
            flush=True,
        )
        load = machine_busy_cores(2.0)
    return load


def machine_info() -> dict[str, Any]:
    versions: dict[str, str | None] = {}
    for pkg in [
        "pyzmq",
        "Django",
        "celery",
        "kombu",
        "dramatiq",
        "pika",
        "huey",
        "rq",
        "redis",
        "psutil",
        "emq-django",
    ]:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    info: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": versions,
        "loadavg_before": os.getloadavg(),
    }
    try:
        import zmq

        info["libzmq"] = zmq.zmq_version()
    except ImportError:
        pass
    commands: list[tuple[list[str], str]] = [
        (["rabbitmqctl", "version"], "rabbitmq"),
        (["redis-server", "--version"], "redis_server"),
    ]
    for cmd, key in commands:
        try:
            info[key] = subprocess.run(
                cmd, capture_output=True, text=True, timeout=20
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            info[key] = None
    return info


KEPT_PER_RUN = (
    "drain_per_s",
    "results_per_s",
    "rtt_p50_ms",
    "rtt_p99_ms",
    "drain_cpu_us_per_task",
    "drain_other_load_cores",
    "results_other_load_cores",
    "loadavg",
    "error",
)


def main(argv: list[str]) -> int:
    opts = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    if "emq" in opts.systems and not emq_available():
        print(
            "emq: emq_django/management/commands/emq_broker.py not found; skipping emq",
            file=sys.stderr,
        )
        opts.systems.remove("emq")
    info = machine_info()
    log_dir = tempfile.mkdtemp(prefix="emq-bench-")
    runs: dict[str, list[dict[str, Any]]] = {}
    for rnd in range(opts.repeats):
        for name in [s for s in ORDER if s in opts.systems]:
            print(
                f"running {name} (round {rnd + 1}/{opts.repeats}) ...",
                file=sys.stderr,
                flush=True,
            )
            idle = wait_for_quiet(opts.quiet_wait)
            t = time.monotonic()
            try:
                r = run_system(name, opts, log_dir)
                r["other_load_cores_before"] = idle
                r["loadavg"] = os.getloadavg()[0]
            except KeyboardInterrupt:
                print("interrupted; servers stopped", file=sys.stderr)
                return 130
            except Exception as e:  # one failing system must not hide the others
                r = {"system": name, "error": str(e)}
                print(f"{name} failed: {e}", file=sys.stderr)
            runs.setdefault(name, []).append(r)
            print(f"  {name} took {time.monotonic() - t:.1f} s", file=sys.stderr, flush=True)
    results: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    for name, rs in runs.items():
        med = median_of_runs(rs)
        bad = [r["error"] for r in rs if "error" in r]
        if bad:
            errors[name] = bad[0]
        if med:
            med["runs_ok"] = len(rs) - len(bad)
            med["all_runs"] = [{k: r.get(k) for k in KEPT_PER_RUN if k in r} for r in rs]
            results[name] = med
    info["loadavg_after"] = os.getloadavg()
    cmp = compare(results)
    print()
    print(
        f"medians of {opts.repeats} run(s); {opts.tasks} no-op jobs, {opts.results_tasks} "
        f"jobs with results, {opts.latency_tasks} round trips; CPU per job of the no-op drain"
    )
    print("\n".join(table(results, errors)))
    print()
    for name in ORDER:
        r = results.get(name)
        if not r:
            continue
        role = r.get("results_cpu_us_per_task_by_role", {})
        loads = [x.get("drain_other_load_cores") for x in r["all_runs"] if "error" not in x]
        print(
            f"{name}: with results, CPU µs/job "
            + "/".join(f"{role.get(k, 0):.0f}" for k in ("producer", "broker", "workers"))
            + "; other load during drains (cores): "
            + ", ".join(f"{v:.2f}" for v in loads if isinstance(v, float))
        )
        for note in r.get("setup", []):
            print(f"    {note}")
    print()
    print("\n".join(summary(cmp)))
    print(
        f"load average before {tuple(round(x, 2) for x in info['loadavg_before'])}, "
        f"after {tuple(round(x, 2) for x in info['loadavg_after'])}"
    )
    doc = {
        "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "params": {
            k: v
            for k, v in vars(opts).items()
            if k not in ("json", "only", "keep_logs", "done_url")
        },
        "machine": info,
        "results": results,
        "errors": errors,
        "emq_vs_peers": cmp,
    }
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(doc, f, indent=2)
        print(f"results written to {opts.json}")
    if opts.keep_logs:
        print(f"server logs in {log_dir}")
    for n, err in errors.items():
        print(f"{n}: a run failed: {err[:2000]}", file=sys.stderr)
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
