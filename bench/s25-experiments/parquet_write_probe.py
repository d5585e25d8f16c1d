import os, sys, time, shutil
sys.path.insert(0, "/work/wt/s25-parse"); sys.path.insert(0, "/work/wt/s25-parse/bench")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
from pathlib import Path
import analytics_bench as ab
from emq_django.analytics import io, transforms
from emq_django.analytics.schema import FINAL_EVENTS
from pyspark.sql import functions as F
from pyspark import StorageLevel

trace = Path("/work/abench-parse/trace")
files = sorted(str(p) for p in trace.glob("trace-*.jsonl"))
if os.environ.get("ONE"):
    files = files[:1]
spark = io.build_session("local[2]", {"spark.driver.memory": "2g", "spark.ui.enabled": "false"})
out = Path("/work/abench-parse/pq"); shutil.rmtree(out, ignore_errors=True); out.mkdir()
ends = io.read_events(spark, files).where(F.col("event").isin(list(FINAL_EVENTS))).select(*transforms.END_COLUMNS)
jobs = transforms.final_job_facts(ends).persist(StorageLevel.MEMORY_ONLY)
print("rows", jobs.count(), flush=True)
LONGS = ["wait_us", "run_us", "e2e_us", "enqueued_ts", "finished_ts", "last_ts", "events", "minute"]

def run(name, opts, conf=None, df=None):
    conf = conf or {}
    old = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items(): spark.conf.set(k, v)
    target = out / name.replace(" ", "_")
    t0, c0, th0 = time.monotonic(), ab.process_cpu(), ab.jvm_threads()
    w = (df if df is not None else jobs).write.mode("overwrite")
    if name == "noop":
        w.format("noop").save()
    else:
        w = w.partitionBy("date")
        for k, v in opts.items(): w = w.option(k, v)
        w.parquet(str(target))
    wall, cpu = time.monotonic() - t0, ab.process_cpu() - c0
    th = ab.threads_since(th0, cpu)
    task = sum(v for k, v in th.items() if k.startswith("Executor task"))
    size = sum(f.stat().st_size for f in target.rglob("*.parquet")) / 1e6 if target.exists() else 0
    print(f"{name:28s} wall {wall:5.1f} cpu {cpu:5.1f} tasks {task:5.1f} MB {size:6.1f} {dict(list(th.items())[:3])}", flush=True)
    for k, v in old.items():
        if v is None: spark.conf.unset(k)
        else: spark.conf.set(k, v)

base = {"parquet.enable.dictionary#job": "false"}
nodict_longs = {**base, **{f"parquet.enable.dictionary#{c}": "false" for c in LONGS}}
variants = {
  "noop": ({}, None),
  "today": (base, None),
  "nochecksum": ({**base, "parquet.page.write-checksum.enabled": "false"}, None),
  "nostats_sizes": ({**base, "parquet.size.statistics.enabled": "false"}, None),
  "nocolstats": ({**base, "parquet.column.statistics.enabled": "false"}, None),
  "nodict_longs": (nodict_longs, None),
  "v2": ({**base, "parquet.writer.version": "v2"}, None),
  "uncompressed": (base, {"spark.sql.parquet.compression.codec": "uncompressed"}),
  "lz4raw": (base, {"spark.sql.parquet.compression.codec": "lz4_raw"}),
  "zstd": (base, {"spark.sql.parquet.compression.codec": "zstd"}),
  "combo": ({**nodict_longs, "parquet.page.write-checksum.enabled": "false", "parquet.size.statistics.enabled": "false"}, None),
  "combo_v2": ({**nodict_longs, "parquet.page.write-checksum.enabled": "false", "parquet.size.statistics.enabled": "false", "parquet.writer.version": "v2"}, None),
  "today2": (base, None),
  "combo_nodict": ({"parquet.enable.dictionary": "false", "parquet.page.write-checksum.enabled": "false", "parquet.size.statistics.enabled": "false"}, None),
  "combo_rows": ({**nodict_longs, "parquet.page.write-checksum.enabled": "false", "parquet.size.statistics.enabled": "false", "parquet.page.row.count.limit": "1000000"}, None),
  "combo_nostats": ({**nodict_longs, "parquet.page.write-checksum.enabled": "false", "parquet.size.statistics.enabled": "false", "parquet.column.statistics.enabled": "false"}, None),
  "combo_v2_nostats": ({**nodict_longs, "parquet.page.write-checksum.enabled": "false", "parquet.size.statistics.enabled": "false", "parquet.writer.version": "v2", "parquet.column.statistics.enabled": "false"}, None),
}
variants["combo_fewer"] = variants["combo"]
variants["today_fewer"] = variants["today"]
print("load", os.getloadavg())
run("warm", base)
for i, name in enumerate(sys.argv[1:] or variants):
    opts, conf = variants[name]
    df = jobs.drop("last_ts", "enqueued_ts", "wait_us", "events") if name.endswith("fewer") else None
    run(f"{name}.{i}", opts, conf, df)
print("load", os.getloadavg())
