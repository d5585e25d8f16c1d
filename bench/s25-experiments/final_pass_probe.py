import os, sys, time, shutil, uuid
sys.path.insert(0, "/work/wt/s25-parse"); sys.path.insert(0, "/work/wt/s25-parse/bench")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
from pathlib import Path
import analytics_bench as ab
from emq_django.analytics import io, transforms
from emq_django.analytics.schema import FINAL_EVENTS
from pyspark.sql import functions as F, Observation

trace = Path("/work/abench-parse/trace")
files = sorted(str(p) for p in trace.glob("trace-*.jsonl"))
spark = io.build_session("local[2]", {"spark.driver.memory": "2g", "spark.ui.enabled": "false"})
io.tune_partitions(spark, sum(os.path.getsize(f) for f in files))
out = Path("/work/abench-parse/pq3"); shutil.rmtree(out, ignore_errors=True); out.mkdir()
LONGS = ["wait_us", "run_us", "e2e_us", "enqueued_ts", "finished_ts", "last_ts", "events", "minute"]
base = {"parquet.enable.dictionary#job": "false"}
combo = {**base, **{f"parquet.enable.dictionary#{c}": "false" for c in LONGS}, "parquet.page.write-checksum.enabled": "false", "parquet.size.statistics.enabled": "false"}
def ends():
    return io.read_events(spark, files).where(F.col("event").isin(list(FINAL_EVENTS))).select(*transforms.END_COLUMNS)
def run(name, df, opts=None):
    t0, c0, th0 = time.monotonic(), ab.process_cpu(), ab.jvm_threads()
    w = df.write.mode("overwrite")
    if opts is None:
        w.format("noop").save()
    else:
        w = w.partitionBy("date")
        for k, v in opts.items(): w = w.option(k, v)
        w.parquet(str(out / name))
    wall, cpu = time.monotonic() - t0, ab.process_cpu() - c0
    th = ab.threads_since(th0, cpu)
    task = sum(v for k, v in th.items() if k.startswith("Executor task"))
    print(f"{name:28s} wall {wall:5.1f} cpu {cpu:5.1f} tasks {task:5.1f} {dict(list(th.items())[:4])}", flush=True)
print("load", os.getloadavg())
spark.read.json(min(files, key=os.path.getsize)).write.format("noop").mode("overwrite").save()
steps = sys.argv[1:] or ["ends", "facts", "facts+obs", "write_today", "write_combo", "write_today", "write_combo"]
for i, s in enumerate(steps):
    if s == "ends": run(s, ends())
    elif s == "facts": run(s, transforms.final_job_facts(ends()))
    elif s == "facts+obs":
        seen = Observation(f"o{uuid.uuid4().hex}")
        run(s, transforms.final_job_facts(ends().observe(seen, *transforms.end_observations())))
    elif s.startswith("write"):
        seen = Observation(f"o{uuid.uuid4().hex}")
        run(f"{s}.{i}", transforms.final_job_facts(ends().observe(seen, *transforms.end_observations())), base if s == "write_today" else combo)
print("load", os.getloadavg())
