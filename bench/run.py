"""Benchmark emq against Celery, Dramatiq and a raw ZeroMQ reference.

    .venv/bin/python bench/run.py [--tasks 20000] [--latency-tasks 1000]
                                  [--only emq,celery,dramatiq,zmq] [--json bench/results.json]

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

from bench.procs import PYTHON, REPO, ServerSet  # noqa: E402
from bench.systems import STARTERS, emq_available  # noqa: E402

ORDER = ["emq", "celery", "dramatiq", "zmq"]


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tasks", type=int, default=20000, help="no-op tasks for enqueue/drain")
    ap.add_argument("--latency-tasks", type=int, default=1000, help="sequential round trips timed")
    ap.add_argument("--latency-warmup", type=int, default=100)
    ap.add_argument(
        "--only", default=",".join(ORDER), help="comma-separated subset of " + ",".join(ORDER)
    )
    ap.add_argument("--json", default=os.path.join(REPO, "bench", "results.json"))
    ap.add_argument("--celery-backend", choices=["redis", "rpc"], default="redis")
    ap.add_argument("--celery-prefetch", type=int, default=64)
    ap.add_argument("--celery-optimization", choices=["default", "fair"], default="default")
    ap.add_argument("--dramatiq-layout", default="1x2", help="PROCESSESxTHREADS")
    ap.add_argument(
        "--dramatiq-prefetch", type=int, default=64, help="0: Dramatiq's default (2 x threads)"
    )
    ap.add_argument("--zmq-credit", type=int, default=100, help="READY credits per zmq worker")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run each system N times (round-robin) and keep its best drain",
    )
    ap.add_argument(
        "--quiet-wait",
        type=float,
        default=60.0,
        help="seconds to wait for other load to drop below 0.25 cores before each system",
    )
    ap.add_argument(
        "--emq-trace",
        action="store_true",
        help="emq with its trace log (EMQ_TRACE_DIR) and the job history recorder "
        "(EMQ_RECORDER=DatabaseRecorder, a fresh SQLite database) on; off otherwise",
    )
    ap.add_argument("--keep-logs", action="store_true", help="print where server logs are kept")
    opts = ap.parse_args(argv)
    opts.systems = [s.strip() for s in opts.only.split(",") if s.strip()]
    unknown = set(opts.systems) - set(ORDER)
    if unknown:
        ap.error(f"unknown systems {sorted(unknown)}; choose from {ORDER}")
    return opts


def run_system(name: str, opts: argparse.Namespace, log_dir: str) -> dict[str, Any]:
    servers = ServerSet(os.path.join(log_dir, name))
    client: subprocess.Popen[bytes] | None = None
    try:
        started = STARTERS[name](servers, opts)
        argv = [
            PYTHON,
            "-m",
            "bench.clients",
            name,
            "--tasks",
            str(opts.tasks),
            "--latency-tasks",
            str(opts.latency_tasks),
            "--latency-warmup",
            str(opts.latency_warmup),
            "--endpoint",
            started.endpoint,
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
        out, err = client.communicate(timeout=600)
        dead = [s.name for s in servers.servers if not s.alive()]
        if client.returncode != 0 or not out.strip():
            tails = "\n".join(f"--- {s.name} log:\n{s.log_tail()}" for s in servers.servers)
            raise RuntimeError(
                f"{name} producer failed (rc={client.returncode}); dead servers: {dead}\n"
                f"{err.decode(errors='replace')[-3000:]}\n{tails}"
            )
        result = json.loads(out.strip().splitlines()[-1])
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


def fmt(v: Any, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def print_table(results: dict[str, dict[str, Any]]) -> None:
    head = (
        f"{'system':<10} | {'enqueue/s':>10} | {'drain tasks/s':>13} | {'CPU µs/task':>11} | "
        f"{'rtt p50 ms':>10} | {'rtt p99 ms':>10}"
    )
    print(head)
    print("-" * len(head))
    for name in ORDER:
        r = results.get(name)
        if r is None:
            continue
        if "error" in r:
            print(f"{name:<10} | failed: {r['error'].splitlines()[0][:70]}")
            continue
        print(
            f"{name:<10} | {fmt(r['enqueue_per_s'], '10,.0f')} | "
            f"{fmt(r['drain_per_s'], '13,.0f')} | "
            f"{fmt(r['cpu_us_per_task'], '11,.0f')} | {fmt(r.get('rtt_p50_ms'), '10.3f')} | "
            f"{fmt(r.get('rtt_p99_ms'), '10.3f')}"
        )
    print()
    for name in ORDER:
        r = results.get(name)
        if r and "error" not in r:
            roles = ", ".join(f"{k} {v:,.0f}" for k, v in r["cpu_us_per_task_by_role"].items())
            print(
                f"{name}: CPU µs/task by role: {roles}; other load during drain: "
                f"{r['other_load_cores']:.2f} cores"
            )
            print(f"    completion: {r['completion']}")
            for note in r.get("setup", []):
                print(f"    {note}")


def ratio(results: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    emq = results.get("emq", {})
    peers = {
        k: results[k]["drain_per_s"]
        for k in ("celery", "dramatiq")
        if k in results and "error" not in results[k]
    }
    if "drain_per_s" not in emq or not peers:
        return None
    best = max(peers, key=lambda k: peers[k])
    return {"best_peer": best, "ratio": emq["drain_per_s"] / peers[best]}


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
    results: dict[str, dict[str, Any]] = {}
    log_dir = tempfile.mkdtemp(prefix="emq-bench-")
    runs: dict[str, list[dict[str, Any]]] = {}
    for rnd in range(opts.repeat):
        for name in [s for s in ORDER if s in opts.systems]:
            print(
                f"running {name} (round {rnd + 1}/{opts.repeat}) ...", file=sys.stderr, flush=True
            )
            idle = wait_for_quiet(opts.quiet_wait)
            t = time.monotonic()
            try:
                r = run_system(name, opts, log_dir)
                r["other_load_cores_before"] = idle
            except KeyboardInterrupt:
                print("interrupted; servers stopped", file=sys.stderr)
                return 130
            except Exception as e:  # one failing system must not hide the others
                r = {"system": name, "error": str(e)}
                print(f"{name} failed: {e}", file=sys.stderr)
            runs.setdefault(name, []).append(r)
            print(f"  {name} took {time.monotonic() - t:.1f} s", file=sys.stderr, flush=True)
    for name, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        best = max(ok, key=lambda r: r["drain_per_s"]) if ok else rs[-1]
        results[name] = dict(
            best,
            runs=len(rs),
            all_runs=[
                {
                    k: r.get(k)
                    for k in (
                        "enqueue_per_s",
                        "drain_per_s",
                        "cpu_us_per_task",
                        "rtt_p50_ms",
                        "rtt_p99_ms",
                        "other_load_cores",
                        "error",
                    )
                }
                for r in rs
            ],
        )
    info["loadavg_after"] = os.getloadavg()
    print()
    print_table(results)
    vs = ratio(results)
    if vs:
        print(
            f"\nemq drain rate / best of celery, dramatiq ({vs['best_peer']}): {vs['ratio']:.2f}x"
        )
    doc = {
        "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "params": {k: v for k, v in vars(opts).items() if k not in ("json", "only", "keep_logs")},
        "machine": info,
        "results": results,
        "emq_vs_best_peer": vs,
    }
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(doc, f, indent=2)
        print(f"results written to {opts.json}")
    if opts.keep_logs:
        print(f"server logs in {log_dir}")
    failed = {n: [r for r in rs if "error" in r] for n, rs in runs.items()}
    for n, bad in failed.items():
        for r in bad:
            print(f"{n}: a run failed: {r['error'][:2000]}", file=sys.stderr)
    return 0 if not any(failed.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
