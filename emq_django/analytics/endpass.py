"""The final path's one pass over trace files, in Spark's Python workers, with Arrow.

A batch of trace files whose attempt ends all carry ``final`` (docs/trace-format.md)
needs, of each job, only its ``"final":true`` line. This pass reads the files once,
cut into byte ranges at line starts (``plan_splits``; one Spark task each, an RDD
of the ranges' numbers), and in each range, in the worker's Python process:

1. keeps the lines that can end a job (``candidate_lines``: the broker's lines are
   told apart by their first 34 bytes, numpy over the whole range; a line in any
   other form is kept too) and parses them with pyarrow's JSON reader (C++); a
   block it refuses is halved until the bad lines are found, which are read one
   at a time as Spark's PERMISSIVE reader reads them (``_coerce``: a field of the
   wrong type is null, a line that is not JSON is dropped);
2. turns the final lines into job facts (``job_facts``: the columns, types and
   values of ``transforms.final_job_facts``) and writes them as Parquet, per date,
   into the pass's directory (``jobs/date=.../``), under names that are the same
   when a task is run again;
3. computes, from the same rows, the partial metrics of its range (``partials``):
   per queue x task x minute the counts, sums and the three latencies' values, per
   job manager x minute and per queue x task x error x minute the counts, written
   beside them (Arrow IPC).

The driver then merges the partials (``merge``): the groups of one queue x task x
minute from several ranges, a queue's minute from its tasks, a task's day from its
minutes. So the trace is read once, the job facts are written once and never read
back in the batch, and no JVM code is generated for any of it. A group's
percentile is the value of rank ceil(p n) while the group has at most
``schema.PERCENTILE_SKETCH_K`` values (what a KLL sketch of that k, as
``transforms`` uses, gives) and comes from such a sketch beyond (Apache
DataSketches' C++ library; within KLL's rank error): ``_Values``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emq_django.analytics.endfacts import (
    JOB_DICTIONARY_COLUMNS,
    JOB_SCHEMA,
    TASK_KEYS,
    UTC_US,
    date_name,
    job_facts,
    partials,
    read_ipc,
    write_ipc,
    write_jobs,
)
from emq_django.analytics.endlines import (
    DAY_US,
    END_SCHEMA,
    MINUTE_US,
    SPLIT_BYTES,
    Counts,
    Split,
    candidate_lines,
    end_lines,
    parse,
    plan_splits,
    read_split,
)
from emq_django.analytics.endmerge import (
    METRIC_SCHEMAS,
    _Values,
    merge,
    write_metric_table,
)

__all__ = [
    "JOB_DICTIONARY_COLUMNS",
    "JOB_SCHEMA",
    "TASK_KEYS",
    "UTC_US",
    "date_name",
    "job_facts",
    "partials",
    "read_ipc",
    "write_ipc",
    "write_jobs",
    "DAY_US",
    "END_SCHEMA",
    "MINUTE_US",
    "SPLIT_BYTES",
    "Counts",
    "Split",
    "candidate_lines",
    "end_lines",
    "parse",
    "plan_splits",
    "read_split",
    "METRIC_SCHEMAS",
    "_Values",
    "merge",
    "write_metric_table",
    "PassResult",
    "run",
    "scan_split",
]

# ---- the Spark task -----------------------------------------------------------------


def scan_split(
    index: int, split: Split, directory: Path, since_us: int | None, until_us: int | None
) -> dict[str, Any]:
    """One range: its job facts to ``directory/jobs``, its partials to
    ``directory/partials``; returns its counts."""
    ends, counts = end_lines(read_split(split), since_us, until_us)
    dates: list[str] = []
    jobs = 0
    if not counts.legacy and counts.final:
        facts, days = job_facts(ends)
        jobs = facts.num_rows
        # unique to this pass (its directory's name), the same if the task runs again
        name = f"part-{index:05d}-{directory.name}"
        dates = write_jobs(facts, days, directory / "jobs", name)
        out = directory / "partials"
        out.mkdir(parents=True, exist_ok=True)
        for kind, table in partials(facts).items():
            write_ipc(table, out / f"{kind}-{index:05d}.arrow")
    return {
        "split": index,
        "ends": counts.ends,
        "final": counts.final,
        "legacy": counts.legacy,
        "jobs": jobs,
        "dates": ",".join(dates),
    }


def _task(
    indexes: Iterable[int],
    splits: list[Split],
    directory: str,
    since_us: int | None,
    until_us: int | None,
) -> Iterator[dict[str, Any]]:
    for index in indexes:
        yield scan_split(index, splits[index], Path(directory), since_us, until_us)


@dataclass
class PassResult:
    counts: Counts = field(default_factory=Counts)
    jobs: int = 0
    dates: list[dt.date] = field(default_factory=list)


def run(
    spark: Any,
    paths: list[Path],
    directory: Path,
    since_us: int | None = None,
    until_us: int | None = None,
    split_bytes: int | None = None,
) -> PassResult:
    """The pass over ``paths``, one Spark task per range of about ``split_bytes``
    (default ``SPLIT_BYTES``); its files in ``directory``."""
    import functools

    splits = plan_splits(paths, split_bytes or SPLIT_BYTES)
    result = PassResult()
    if not splits:
        return result
    directory.mkdir(parents=True, exist_ok=True)
    task = functools.partial(
        _task, splits=splits, directory=str(directory), since_us=since_us, until_us=until_us
    )
    # An RDD of the ranges' numbers, one per partition: the rows that come back are
    # a few counts each (the facts and partials are files), and the RDD API needs
    # no Arrow transport (and no pandas) between the JVM and the workers.
    ids = spark.sparkContext.parallelize(range(len(splits)), len(splits))
    dates: set[str] = set()
    for row in ids.mapPartitions(task).collect():
        result.counts.add(Counts(row["ends"], row["final"], row["legacy"]))
        result.jobs += row["jobs"]
        dates.update(d for d in row["dates"].split(",") if d)
    result.dates = sorted(dt.date.fromisoformat(d) for d in dates)
    return result
