import os, sys, time, json
sys.path.insert(0, "/work/wt/s25-parse"); sys.path.insert(0, "/work/wt/s25-parse/bench")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
from pathlib import Path
import analytics_bench as ab
from emq_django.analytics import io, transforms
from emq_django.analytics.schema import FINAL_EVENTS
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

which = sys.argv[1] if len(sys.argv) > 1 else "all"
trace = Path("/work/abench-parse/trace")
files = sorted(str(p) for p in trace.glob("trace-*.jsonl"))
if os.environ.get("ONE"):
    files = files[:1]
spark = io.build_session("local[2]", {"spark.driver.memory": "2g", "spark.ui.enabled": "false"})
small = min(files, key=lambda p: os.path.getsize(p))
spark.read.json(small).write.format("noop").mode("overwrite").save()

v = F.col("value")
def loc(s, col, pos):
    return F.call_function("locate", F.lit(s), col, pos)

t = F.instr(v, ',"event":"')
nm = F.substring(v, t + 10, 15) if False else F.expr("substr(value, instr(value, ',\"event\":\"') + 10, 15)")
prefix_ok = v.startswith('{"ts":') & (t > 0) & (loc('"', v, F.lit(6)) == t + 1)
final_name = F.lit(False)
for e in FINAL_EVENTS:
    final_name = final_name | nm.startswith(e + '"')
cand = ~prefix_ok | final_name | (F.instr(nm, "\\") > 0)

END_SCHEMA = StructType([f for f in transforms.EVENT_SCHEMA.fields if f.name in transforms.END_COLUMNS])

def text():
    return spark.read.text(files)

def fast_split(df):
    p = F.split(v, ",", -1)
    n = F.size(p)
    def part(i):
        return F.col("_p").getItem(i)
    def sval(i, key):  # "key":"value"
        k = f'"{key}":"'
        x = part(i)
        return F.when(x.startswith(k) & x.endswith('"'), F.expr(f"substr(_p[{i}], {len(k)+1}, length(_p[{i}]) - {len(k)+1})"))
    def nval(i, key):
        k = f'"{key}":'
        x = part(i)
        return F.when(x.startswith(k), F.expr(f"try_cast(substr(_p[{i}], {len(k)+1}) as bigint)"))
    df = df.select("value", p.alias("_p"))
    return df.select(F.col("_p")[0].alias("p0"),
        F.expr("try_cast(substr(_p[0], 7) as bigint)").alias("ts"),
        sval(1, "event").alias("event"),
        sval(2, "job").alias("job"),
        nval(3, "attempt").alias("attempt"),
        sval(4, "task").alias("task"),
        sval(5, "queue").alias("queue"),
        sval(6, "jm").alias("jm"),
        nval(7, "run_us").alias("run_us"),
        nval(8, "total_us").alias("total_us"),
        (part(9).startswith('"final":true')).alias("final"),
        F.size("_p").alias("n"),
    )

def fast_sidx(df):
    def after(key):  # value text after "key": up to next , or }
        return F.substring_index(F.substring_index(v, f'"{key}":', -1), ",", 1)
    def sv(key):
        return F.substring_index(F.substring_index(v, f'"{key}":"', -1), '"', 1)
    return df.select(
        F.expr("try_cast(substring_index(substr(value, 7), ',', 1) as bigint)").alias("ts"),
        sv("event").alias("event"), sv("job").alias("job"),
        after("attempt").cast("int").alias("attempt"), sv("task").alias("task"), sv("queue").alias("queue"), sv("jm").alias("jm"),
        after("run_us").alias("run_us"), after("total_us").alias("total_us"), F.instr(v, '"final":true').alias("final"),
        F.instr(v, '"retries":').alias("r"), F.instr(v, '"requeues":').alias("q"), F.instr(v, '"error":').alias("e"),
    )

GRAMMAR = (r'^\{"ts":(?:0|[1-9][0-9]{0,17}),"event":"(?:succeeded|failed|timed_out|dead_lettered)","job":"[^"\\\x00-\x1f]*",'
           r'"attempt":(?:0|[1-9][0-9]{0,8}),"task":(?:null|"[^"\\\x00-\x1f]*"),"queue":"[^"\\\x00-\x1f]*","jm":(?:null|"[^"\\\x00-\x1f]*"),'
           r'"run_us":-?(?:0|[1-9][0-9]{0,17}),"total_us":-?(?:0|[1-9][0-9]{0,17}),"final":(?:true|false)'
           r'(?:,"retries":(?:0|[1-9][0-9]{0,8}))?(?:,"requeues":(?:0|[1-9][0-9]{0,8}))?(?:,"partials":(?:0|[1-9][0-9]{0,17}))?(?:,"error":(?:null|"[^"\\\x00-\x1f]*"))?\}$')

def run(name, df):
    t0, c0, th0 = time.monotonic(), ab.process_cpu(), ab.jvm_threads()
    df.write.format("noop").mode("overwrite").save()
    wall, cpu = time.monotonic() - t0, ab.process_cpu() - c0
    th = ab.threads_since(th0, cpu)
    task = sum(v for k, v in th.items() if k.startswith("Executor task"))
    print(f"{name:40s} wall {wall:6.1f}  cpu {cpu:6.1f}  tasks {task:6.1f}  {dict(list(th.items())[:4])}", flush=True)

variants = {
  "text": lambda: text(),
  "text+cand": lambda: text().where(cand),
  "text+cand2": lambda: text().select("value", t.alias("t"), loc('"', v, F.lit(6)).alias("q")).select("value", "t", "q", F.expr("substr(value, t + 10, 4)").alias("n4")).where(~(F.col("value").startswith('{"ts":') & (F.col("t") > 0) & (F.col("q") == F.col("t") + 1) & ~F.col("n4").isin("succ", "fail", "time", "dead") & (F.instr("n4", "\\") == 0))),
  "text+cand3": lambda: text().where(~(F.substring(v, 23, 14).isin(',"event":"enqu', ',"event":"disp', ',"event":"requ', ',"event":"retr') & v.startswith('{"ts":1') & (F.instr(F.substring(v, 7, 16), '"') == 0))),
  "text+final_instr": lambda: text().where(F.instr(v, '"final":true') > 0),
  "text+cand+noBS": lambda: text().where(cand).where(F.instr(v, "\\") == 0),
  "text+cand+split": lambda: fast_split(text().where(cand)),
  "text+cand2+split": lambda: fast_split(variants["text+cand2"]().select("value")),
  "text+final_instr+split": lambda: fast_split(variants["text+final_instr"]().select("value")),
  "text+cand+sidx": lambda: fast_sidx(text().where(cand)),
  "text+cand+rlike": lambda: text().where(cand).where(v.rlike(GRAMMAR)),
  "text+cand+utf8": lambda: text().where(cand).where(F.call_function("is_valid_utf8", v)),
  "text+cand+from_json": lambda: text().where(cand).select(F.inline(F.array(F.from_json(v, END_SCHEMA)))),
  "json pushed": lambda: io.read_events(spark, files).where(F.col("event").isin(list(FINAL_EVENTS))).select(*transforms.END_COLUMNS),
  "bare count": lambda: None,
}
order = sys.argv[2:] if len(sys.argv) > 2 else list(variants)
print("load", os.getloadavg())
for name in [o for o in order if not o.startswith(("csv", "json ts", "fast", "text+drop", "drop+", "x"))]:
    if name == "bare count":
        t0, c0 = time.monotonic(), ab.process_cpu()
        spark.read.schema(transforms.EVENT_SCHEMA).json(files).count()
        print(f"{'bare count':40s} wall {time.monotonic()-t0:6.1f}  cpu {ab.process_cpu()-c0:6.1f}")
        continue
    run(name, variants[name]())
print("load", os.getloadavg())

from pyspark.sql.types import StructField, StringType
CSV_SCHEMA = StructType([StructField(f"c{i}", StringType()) for i in range(17)])
def csv():
    return (spark.read.schema(CSV_SCHEMA).option("delimiter", ',"').option("quote", "").option("escape", "")
            .option("header", "false").option("mode", "PERMISSIVE").csv(files))
END4 = ['event":"succ', 'event":"fail', 'event":"time', 'event":"dead']
def csv_filter(df):
    return df.where(F.substring("c1", 1, 12).isin(END4) | ~F.col("c0").startswith('{"ts":'))
C = F.col
def csv_extract(df):
    def sv(c, key):
        k = f'{key}":"'
        return F.when(C(c).startswith(k) & C(c).endswith('"'), F.expr(f"substr({c}, {len(k)+1}, length({c}) - {len(k)+1})"))
    def nv(c, key):
        k = f'{key}":'
        return F.when(C(c).startswith(k), F.expr(f"try_cast(substr({c}, {len(k)+1}) as bigint)"))
    return df.select(
        F.expr("try_cast(substr(c0, 7) as bigint)").alias("ts"),
        sv("c1", "event").alias("event"), sv("c2", "job").alias("job"), nv("c3", "attempt").alias("attempt"),
        sv("c4", "task").alias("task"), sv("c5", "queue").alias("queue"), sv("c6", "jm").alias("jm"),
        nv("c7", "run_us").alias("run_us"), nv("c8", "total_us").alias("total_us"), (C("c9") == 'final":true').alias("final"),
        "c10", "c11", "c12", "c13", "c16")
variants["csv"] = lambda: csv()
variants["csv c1"] = lambda: csv().select("c1")
variants["csv+filter"] = lambda: csv_filter(csv())
variants["csv+filter+extract"] = lambda: csv_extract(csv_filter(csv()))
variants["json ts,event pushed"] = lambda: spark.read.schema("ts long, event string").json(files).where(F.col("event").isin(list(FINAL_EVENTS)))
for name in order:
    if name.startswith(("csv", "json ts")):
        run(name, variants[name]())

from emq_django.analytics import endlines
variants["text+drop"] = lambda: text().where(~endlines.drop_line(v))
variants["fast ctrl"] = lambda: endlines.read_ends(spark, files, True)
variants["fast noctrl"] = lambda: endlines.read_ends(spark, files, False)
variants["fast noctrl fastonly"] = lambda: endlines.fast_fields(text().where(~endlines.drop_line(v)), False).where("_fast").select("_row.*")
variants["drop+from_json"] = lambda: text().where(~endlines.drop_line(v)).select(F.inline(F.array(F.from_json(v, endlines.END_SCHEMA))))
for name in order:
    if name.startswith(("fast", "text+drop", "drop+")) and not name.startswith("x"):
        run(name, variants[name]())
def split_only(df):
    b = F.substring_index(v, "}", 1)
    d = df.select(F.split(b, ",", -1).alias("_p"))
    return d.select(*[F.get("_p", F.lit(i)).alias(f"c{i}") for i in range(10)])
def sidx_only(df):
    return df.select(*[F.substring_index(v, ",", i).alias(f"c{i}") for i in range(1, 11)])
variants["xsplit only"] = lambda: split_only(text().where(~endlines.drop_line(v)))
variants["xsidx only"] = lambda: sidx_only(text().where(~endlines.drop_line(v)))
variants["xsplit+casts"] = lambda: split_only(text().where(~endlines.drop_line(v))).select(*[F.substring(f"c{i}", 5, 100).try_cast("bigint").alias(f"n{i}") for i in range(10)])
for name in order:
    if name.startswith("x"):
        run(name, variants[name]())
