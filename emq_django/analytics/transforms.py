"""Pure DataFrame -> DataFrame transforms over trace events (docs/trace-format.md).

Times stay in microseconds here; ``minute`` is the UTC minute of a job's final
event (a timestamp truncated to the minute) and ``date`` its UTC date, the
partition key of every output. Null tasks become ``""``.

- ``job_facts(events)``: one row per job with its outcome (null while open).
- ``attempt_facts(events)``: one row per finished attempt (for utilisation).
- ``task_minute_metrics`` / ``queue_minute_metrics(jobs)``: counts, throughput,
  p50/p95/p99 of wait, run and end-to-end time per queue (x task) x minute.
- ``jm_minute_metrics(attempts)``: busy time and utilisation per job manager x minute.
- ``failures_by_error(jobs)``: failed jobs per queue x task x error x minute.
- ``slowest_tasks(jobs, limit)``: per date, the tasks with the highest p95 run time.
"""

from __future__ import annotations

from emq_django.analytics.events import (
    END_COLUMNS,
    EVENT_CODES,
    EVENT_COLUMNS,
    EVENT_SCHEMA,
    FACT_COLUMNS,
    MAP_LOOKUP_LIMIT,
    TS_SHIFT,
    clean_events,
)
from emq_django.analytics.final_facts import (
    all_attempts,
    dedupe_jobs,
    end_observations,
    final_attempt_facts,
    final_job_facts,
)
from emq_django.analytics.job_partials import (
    CARRIED_STRINGS,
    PARTIAL_COLUMNS,
    Dictionary,
    attempt_dates,
    attempt_facts,
    carried_partials,
    carried_strings,
    carry_partials,
    date_of,
    decode_attempts,
    decode_jobs,
    event_partials,
    is_finished,
    job_facts,
    merge_partials,
    string_observations,
    string_values,
)
from emq_django.analytics.metrics import (
    failures_by_error,
    jm_minute_metrics,
    queue_minute_metrics,
    slowest_tasks,
    task_minute_metrics,
)

__all__ = [
    "EVENT_SCHEMA",
    "EVENT_COLUMNS",
    "FACT_COLUMNS",
    "END_COLUMNS",
    "clean_events",
    "EVENT_CODES",
    "TS_SHIFT",
    "MAP_LOOKUP_LIMIT",
    "PARTIAL_COLUMNS",
    "CARRIED_STRINGS",
    "event_partials",
    "merge_partials",
    "carried_partials",
    "carry_partials",
    "carried_strings",
    "date_of",
    "attempt_dates",
    "string_observations",
    "string_values",
    "Dictionary",
    "is_finished",
    "decode_jobs",
    "job_facts",
    "decode_attempts",
    "attempt_facts",
    "final_job_facts",
    "final_attempt_facts",
    "all_attempts",
    "end_observations",
    "dedupe_jobs",
    "task_minute_metrics",
    "queue_minute_metrics",
    "jm_minute_metrics",
    "failures_by_error",
    "slowest_tasks",
]
