"""The analytics pipeline on synthetic traces: events/s and peak memory.

    .venv/bin/python bench/analytics_bench.py --events 10000000 --master 'local[2]'

Writes synthetic hourly trace files (emq_django.analytics.synth), then runs one
``emq_analyze`` batch over them (the same ``Analyzer`` the command runs: JSON ->
job facts -> Parquet -> metrics -> a scratch SQLite database), then a rerun with
nothing new. Memory is the resident set of this process and every child (the
Spark JVM), sampled every 0.2 s; the peak of their sum is reported.

Measured here (2 cores, others' work running, load average about 3), 9,986,029
events (3,257,328 jobs, 4 hourly files, 1.67 GB), local[2]:
  --driver-memory 4g: 186 s, 53,600 events/s, peak RSS 4.8 GB (JVM 4.7 GB)
  --driver-memory 2g: 174 s, 57,500 events/s, peak RSS 2.7 GB (JVM 2.6 GB)
The JVM grows to the heap it is given; 2g is enough. A rerun with nothing new: 0 s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--rate", type=float, default=300.0, help="jobs/s in the trace")
    parser.add_argument("--driver-memory", default="4g")
    parser.add_argument("--dir", help="work directory (default: a temporary one)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()

    work = Path(args.dir or tempfile.mkdtemp(prefix="emq-analytics-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    os.environ["DATABASE_URL"] = f"sqlite:///{work / 'bench.sqlite3'}"
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    import django

    django.setup()
    from django.core.management import call_command

    from emq_django.analytics.io import build_session
    from emq_django.analytics.pipeline import AnalyzeConfig, Analyzer
    from emq_django.analytics.synth import SynthConfig, generate, write_trace

    call_command("migrate", verbosity=0)
    trace = work / "trace"
    jobs = int(args.events / EVENTS_PER_JOB)
    t0 = time.monotonic()
    counts = write_trace(
        generate(SynthConfig(jobs=jobs, start=1_772_359_200.0, rate=args.rate, seed=1)), trace
    )
    events = sum(counts.values())
    size = sum(p.stat().st_size for p in trace.iterdir())
    synth_s = time.monotonic() - t0
    print(
        f"synth: {events} events of {jobs} jobs, {len(counts)} files, {size / 1e9:.2f} GB, "
        f"{synth_s:.0f} s"
    )

    with PeakRss() as mem:
        t0 = time.monotonic()
        spark = build_session(
            args.master, {"spark.driver.memory": args.driver_memory, "spark.ui.enabled": "false"}
        )
        startup_s = time.monotonic() - t0
        config = AnalyzeConfig(trace_dir=trace, output=work / "out")
        t0 = time.monotonic()
        result = Analyzer(spark, config).run_once()
        run_s = time.monotonic() - t0
        t0 = time.monotonic()
        rerun = Analyzer(spark, config).run_once()
        rerun_s = time.monotonic() - t0
        spark.stop()
    figures = {
        "events": events,
        "jobs": jobs,
        "trace_bytes": size,
        "master": args.master,
        "spark_startup_s": round(startup_s, 1),
        "run_s": round(run_s, 1),
        "events_per_s": round(events / run_s),
        "peak_rss_total_mb": mem.peak_total // 2**20,
        "peak_rss_jvm_mb": mem.peak_jvm // 2**20,
        "driver_memory": args.driver_memory,
        "rerun_s": round(rerun_s, 2),
        "rerun_events": rerun.events,
        "finished_jobs": result.finished_jobs,
        "db_rows": result.db_rows,
        "cpus": os.cpu_count(),
        "load_avg_1m_after": os.getloadavg()[0],
    }
    print(result.describe())
    print(json.dumps(figures, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
