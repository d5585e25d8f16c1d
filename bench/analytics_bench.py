"""The analytics pipeline on synthetic traces: events/s and peak memory.

    .venv/bin/python bench/analytics_bench.py --events 10000000 --master 'local[2]'

Writes synthetic hourly trace files (emq_django.analytics.synth) once into
``--dir/trace`` (reused by later runs with the same arguments), then, in one Spark
session: a bare read and count of those files (explicit schema), one
``emq_analyze`` batch over them (the same ``Analyzer`` the command runs: JSON ->
job facts -> metrics -> Parquet and a scratch SQLite database), the bare read and
count again, a read that parses every field (context only), and a rerun with
nothing new. The ratio is the pipeline's time over the mean of the two bare
reads: the machine is shared, so compare only ratios from one run. The
pipeline's CPU is also split by JVM thread (tasks, JIT compilers, garbage
collector) and the Python driver, to show where it goes. Memory is the
resident set of this process and every child (the Spark JVM), sampled every
0.2 s; the peak of their sum is reported.

Before this issue's changes (commit 2a086bb), on 998,210 events (one 167 MB file),
local[2], 2g, load average 8-13: 480 s against a bare read of 24 s (19.8x).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

EVENTS_PER_JOB = 3.07  # what the default profiles produce, measured


class PeakRss:
    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        self.peak_total = 0
        self.peak_jvm = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            total, jvm = 0, 0
            for p in [me, *me.children(recursive=True)]:
                try:
                    rss = p.memory_info().rss
                    total += rss
                    if "java" in p.name():
                        jvm += rss
                except psutil.Error:
                    pass
            self.peak_total = max(self.peak_total, total)
            self.peak_jvm = max(self.peak_jvm, jvm)
            self._stop.wait(self.interval)


def synth_trace(
    trace: Path, events: int, rate: float, legacy: bool = False
) -> tuple[int, int, int]:
    """The synthetic trace in ``trace``, written once: a later run with the same
    arguments reuses it (``_synth.json`` records them). Returns (events, jobs, bytes)."""
    from emq_django.analytics.synth import SynthConfig, generate, write_trace

    jobs = int(events / EVENTS_PER_JOB)
    marker = trace / "_synth.json"
    wanted: dict[str, Any] = {"jobs": jobs, "rate": rate, "seed": 1, "format": 2}
    if legacy:
        wanted["legacy"] = True
    if marker.exists():
        doc = json.loads(marker.read_text())
        if doc["config"] == wanted:
            print(f"synth: reusing {trace} ({doc['events']} events)")
            return doc["events"], jobs, doc["bytes"]
    shutil.rmtree(trace, ignore_errors=True)
    t0 = time.monotonic()
    counts = write_trace(
        generate(SynthConfig(jobs=jobs, start=1_772_359_200.0, rate=rate, seed=1, legacy=legacy)),
        trace,
    )
    n = sum(counts.values())
    size = sum(p.stat().st_size for p in trace.glob("trace-*.jsonl"))
    marker.write_text(json.dumps({"config": wanted, "events": n, "bytes": size}))
    print(
        f"synth: {n} events of {jobs} jobs, {len(counts)} files, {size / 1e9:.2f} GB, "
        f"{time.monotonic() - t0:.0f} s"
    )
    return n, jobs, size


def process_cpu() -> float:
    """CPU seconds (user + system) of this process and its descendants (the Spark
    JVM, and its Python workers) so far, and of the descendants that ended (each
    parent's reaped children): on a loaded machine, steadier than the wall clock."""
    total = 0.0
    me = psutil.Process()
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return total


def python_workers() -> dict[int, float]:
    """CPU seconds so far of each process under the Spark JVM that is not a JVM:
    PySpark's daemon and its Python workers (the final path's pass runs there),
    with their reaped children."""
    out: dict[int, float] = {}
    for p in psutil.Process().children(recursive=True):
        try:
            if "java" in p.name():
                continue
            t = p.cpu_times()
            out[p.pid] = t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return out


def workers_since(before: dict[int, float]) -> float:
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in python_workers().items())


def jvm_threads() -> dict[tuple[int, str], float]:
    """CPU seconds so far of each thread of the Spark JVM, by (thread id, kind):
    the kind is the thread's name as Linux keeps it (15 characters) without its
    number, such as the tasks (``Executor task ...``), the JIT compilers
    (``C1``/``C2 CompilerThre``), the garbage collector (``GC Thread``). Linux only
    (/proc); empty elsewhere."""
    out: dict[tuple[int, str], float] = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for p in psutil.Process().children(recursive=True):
        try:
            if "java" not in p.name():
                continue
            for t in Path(f"/proc/{p.pid}/task").iterdir():
                try:
                    stat = (t / "stat").read_text()
                except OSError:
                    continue
                name = stat[stat.index("(") + 1 : stat.rindex(")")]
                kind = re.sub(r"[#\d]+$", "", name).strip() or name
                fields = stat[stat.rindex(")") + 2 :].split()
                out[(int(t.name), kind)] = (int(fields[11]) + int(fields[12])) / tick
        except (psutil.Error, OSError):
            pass
    return out


def threads_since(before: dict[tuple[int, str], float], total: float) -> dict[str, float]:
    """CPU seconds by thread kind since ``before`` (``jvm_threads``), of ``total``
    (the CPU of this process and the JVM over the same time): what no live thread
    accounts for (this process, threads that ended) is ``(other)``."""
    spent: dict[str, float] = {}
    for key, cpu in jvm_threads().items():
        spent[key[1]] = spent.get(key[1], 0.0) + cpu - before.get(key, 0.0)
    spent["(other)"] = total - sum(spent.values())
    rounded = {k: round(v, 1) for k, v in spent.items() if v >= 0.2}
    return dict(sorted(rounded.items(), key=lambda kv: -kv[1]))


def bare_read(spark: Any, trace: Path) -> tuple[float, int]:
    """Seconds for a bare Spark read and count of the trace files (the same
    explicit schema as the pipeline, no cleaning), and the count."""
    from emq_django.analytics.transforms import EVENT_SCHEMA

    paths = [str(p) for p in sorted(trace.glob("trace-*.jsonl"))]
    t0 = time.monotonic()
    n = spark.read.schema(EVENT_SCHEMA).json(paths).count()
    return time.monotonic() - t0, n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--rate", type=float, default=300.0, help="jobs/s in the trace")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument(
        "--dir", help="work directory; its trace is kept and reused (default: a temporary one)"
    )
    parser.add_argument(
        "--legacy",
        action="store_true",
        help="a trace as brokers wrote it before `final` (the full path)",
    )
    parser.add_argument("--event-log", help="write Spark's event log here (for the history UI)")
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument(
        "--java-options", default="", help="more options for the driver JVM (experiments)"
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the session (experiments; may be given again)",
    )
    args = parser.parse_args()

    work = Path(args.dir or tempfile.mkdtemp(prefix="emq-analytics-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    db = work / "bench.sqlite3"
    db.unlink(missing_ok=True)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    os.environ["DATABASE_URL"] = f"sqlite:///{db}"
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    import django

    django.setup()
    from django.core.management import call_command

    from emq_django.analytics.io import build_session
    from emq_django.analytics.pipeline import AnalyzeConfig, Analyzer
    from emq_django.analytics.transforms import EVENT_SCHEMA

    call_command("migrate", verbosity=0)
    trace = work / "trace"
    events, jobs, size = synth_trace(trace, args.events, args.rate, args.legacy)

    conf = {"spark.driver.memory": args.driver_memory, "spark.ui.enabled": "false"}
    if args.java_options:
        from emq_django.analytics.io import java_options

        conf["spark.driver.extraJavaOptions"] = f"{java_options(args.master)} {args.java_options}"
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--conf takes KEY=VALUE, not {item!r}")
        conf[key] = value
    if args.event_log:
        Path(args.event_log).mkdir(parents=True, exist_ok=True)
        conf |= {"spark.eventLog.enabled": "true", "spark.eventLog.dir": args.event_log}
    load_before = os.getloadavg()
    with PeakRss() as mem:
        t0 = time.monotonic()
        spark = build_session(args.master, conf)
        startup_s = time.monotonic() - t0
        # Neither figure includes the JVM's warm-up (its JIT) on the JSON reader.
        smallest = min(trace.glob("trace-*.jsonl"), key=lambda p: p.stat().st_size)
        spark.read.json(str(smallest)).write.format("noop").mode("overwrite").save()
        # The bare read before and after the pipeline: the machine is shared, so
        # the ratio is taken to their mean, and each is shown.
        c0 = process_cpu()
        bare_before, bare_n = bare_read(spark, trace)
        cpu_before = process_cpu() - c0
        print(
            f"bare read and count: {bare_n} lines in {bare_before:.1f} s ({cpu_before:.1f} CPU s)"
        )
        config = AnalyzeConfig(trace_dir=trace, output=out)
        t0, c0, th0, pw0 = time.monotonic(), process_cpu(), jvm_threads(), python_workers()
        py0 = psutil.Process().cpu_times()
        result = Analyzer(spark, config).run_once()
        run_s, run_cpu = time.monotonic() - t0, process_cpu() - c0
        py1 = psutil.Process().cpu_times()
        python_cpu = py1.user + py1.system - py0.user - py0.system
        workers_cpu = workers_since(pw0)
        run_threads = threads_since(th0, run_cpu - python_cpu - workers_cpu)
        run_threads["(python driver)"] = round(python_cpu, 1)
        run_threads["(python workers)"] = round(workers_cpu, 1)
        print(f"pipeline: {result.describe()} ({run_cpu:.1f} CPU s)")
        print(f"pipeline CPU by thread: {run_threads}")
        c0, th0 = process_cpu(), jvm_threads()
        bare_after, _ = bare_read(spark, trace)
        cpu_after = process_cpu() - c0
        bare_threads = threads_since(th0, cpu_after)
        print(f"bare read CPU by thread: {bare_threads}")
        print(f"bare read and count again: {bare_after:.1f} s ({cpu_after:.1f} CPU s)")
        # For context, not the ratio: reading every field of every line, no more.
        paths = [str(p) for p in sorted(trace.glob("trace-*.jsonl"))]
        t0 = time.monotonic()
        spark.read.schema(EVENT_SCHEMA).json(paths).write.format("noop").mode("overwrite").save()
        parse_s = time.monotonic() - t0
        print(f"bare read with every field parsed: {parse_s:.1f} s")
        t0 = time.monotonic()
        rerun = Analyzer(spark, config).run_once()
        rerun_s = time.monotonic() - t0
        spark.stop()
    bare_s = (bare_before + bare_after) / 2
    bare_cpu = (cpu_before + cpu_after) / 2
    figures = {
        "events": events,
        "jobs": jobs,
        "trace_bytes": size,
        "master": args.master,
        "legacy_trace": args.legacy,
        "driver_memory": args.driver_memory,
        "java_options": args.java_options,
        "conf": args.conf,
        "spark_startup_s": round(startup_s, 1),
        "bare_read_count_s": [round(bare_before, 1), round(bare_after, 1)],
        "run_s": round(run_s, 1),
        "ratio_to_bare": round(run_s / bare_s, 2),
        "bare_read_count_cpu_s": [round(cpu_before, 1), round(cpu_after, 1)],
        "run_cpu_s": round(run_cpu, 1),
        "run_cpu_by_thread_s": run_threads,
        "bare_after_cpu_by_thread_s": bare_threads,
        "cpu_ratio_to_bare": round(run_cpu / bare_cpu, 2),
        "bare_parse_all_s": round(parse_s, 1),
        "events_per_s": round(events / run_s),
        "peak_rss_total_mb": mem.peak_total // 2**20,
        "peak_rss_jvm_mb": mem.peak_jvm // 2**20,
        "rerun_s": round(rerun_s, 2),
        "rerun_events": rerun.events,
        "finished_jobs": result.finished_jobs,
        "db_rows": result.db_rows,
        "cpus": os.cpu_count(),
        "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(figures, indent=1))
    print(
        f"pipeline {run_s:.1f} s, bare read and count {bare_s:.1f} s "
        f"(mean of {bare_before:.1f} and {bare_after:.1f}): {run_s / bare_s:.2f}x; "
        f"CPU {run_cpu:.1f} s against {bare_cpu:.1f} s: {run_cpu / bare_cpu:.2f}x"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
