"""``manage.py emq_analyze``: the trace log -> Parquet metrics and the admin's charts."""

from __future__ import annotations

import datetime as dt
import importlib.util
import logging
import signal
import threading
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from emq_django.analytics import INSTALL_HINT
from emq_django.conf import get_settings

# What the analytics extra installs and the pipeline imports (pyarrow, numpy and
# datasketches: the final path's pass, emq_django/analytics/endpass.py).
ANALYTICS_MODULES = ("pyspark", "pyarrow", "numpy", "datasketches")

log = logging.getLogger(__name__)

DEMO_TRACE_DIR = "var/trace"  # where `make demo` has the broker write it


def parse_time(value: str) -> dt.datetime:
    """ISO 8601 (``2026-11-21``, ``2026-11-21T10:00``); naive means UTC."""
    try:
        t = dt.datetime.fromisoformat(value)
    except ValueError as exc:
        raise CommandError(f"bad time {value!r}: use ISO 8601, e.g. 2026-11-21T10:00") from exc
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def default_output() -> str:
    from emq_django.conf import read

    return str(read("ANALYTICS_DIR") or "var/analytics")


class Command(BaseCommand):
    help = (
        "Turn the broker's trace log (EMQ_TRACE_DIR) into throughput, latency and failure "
        "metrics: Parquet under --output, and the emq_analytics models the admin charts. "
        "Only trace data not seen before is read (a checkpoint in --output). Spark logs "
        "errors only; -v 2 adds its warnings, -v 3 its info."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--trace-dir", help=f"trace directory (default EMQ_TRACE_DIR or {DEMO_TRACE_DIR})"
        )
        parser.add_argument(
            "--output",
            help="Parquet output and checkpoint (default EMQ_ANALYTICS_DIR or var/analytics)",
        )
        parser.add_argument("--master", default="local[*]", help="local[*] or spark://host:port")
        parser.add_argument("--since", type=parse_time, help="first UTC time to include")
        parser.add_argument("--until", type=parse_time, help="UTC time to stop before")
        parser.add_argument(
            "--follow", action="store_true", help="keep running (Structured Streaming)"
        )
        parser.add_argument("--interval", type=float, default=10.0, help="--follow period (s)")
        parser.add_argument("--no-db", action="store_true", help="write Parquet only")
        parser.add_argument(
            "--conf", action="append", default=[], metavar="KEY=VALUE", help="Spark setting"
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        missing = [m for m in ANALYTICS_MODULES if importlib.util.find_spec(m) is None]
        if "pyspark" in missing:
            raise CommandError(f"emq_analyze needs PySpark, which is not installed: {INSTALL_HINT}")
        if missing:
            raise CommandError(
                f"emq_analyze needs {', '.join(missing)}, which is not installed: {INSTALL_HINT}"
            )
        trace_dir = opts["trace_dir"] or get_settings().TRACE_DIR or DEMO_TRACE_DIR
        if not Path(trace_dir).is_dir():
            raise CommandError(
                f"trace directory {trace_dir} does not exist: run the broker with EMQ_TRACE_DIR "
                "set, or pass --trace-dir"
            )
        from emq_django.analytics.pipeline import AnalyzeConfig, Analyzer

        config = AnalyzeConfig(
            trace_dir=Path(trace_dir),
            output=Path(opts["output"] or default_output()),
            since=opts["since"],
            until=opts["until"],
            update_db=not opts["no_db"],
        )
        files = sorted(Path(trace_dir).glob("trace-*.jsonl"))
        self.stdout.write(f"emq_analyze: {len(files)} trace files in {trace_dir}; starting Spark")
        level = {0: "ERROR", 1: "ERROR", 2: "WARN"}.get(opts["verbosity"], "INFO")
        spark = self._session(opts["master"], opts["conf"], level)
        try:
            analyzer = Analyzer(spark, config)
            if opts["follow"]:
                self._follow(analyzer, opts["interval"])
            else:
                self.stdout.write("emq_analyze: reading what is new since the last run...")
                result = analyzer.run_once()
                self.stdout.write(f"emq_analyze: {result.describe()}")
                self._written(result, config)
        finally:
            spark.stop()

    def _written(self, result: Any, config: Any) -> None:
        if result.db_rows:
            rows = ", ".join(f"{table} {n}" for table, n in sorted(result.db_rows.items()))
            self.stdout.write(f"emq_analyze: rows written to the admin's tables: {rows}")
        if result.dates:
            self.stdout.write(f"emq_analyze: Parquet tables under {config.output}")

    def _session(self, master: str, conf_args: list[str], log_level: str) -> Any:
        from emq_django.analytics.io import build_session

        conf = {}
        for item in conf_args:
            key, sep, value = item.partition("=")
            if not sep:
                raise CommandError(f"--conf {item!r}: want KEY=VALUE")
            conf[key] = value
        try:
            return build_session(master, conf, log_level=log_level)
        except Exception as exc:  # PySpark raises plain exceptions when Java is missing
            raise CommandError(
                f"could not start Spark on {master}: {exc} (PySpark needs Java 17+ on PATH "
                f"or JAVA_HOME)"
            ) from exc

    def _follow(self, analyzer: Any, interval: float) -> None:
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        self.stdout.write(f"following {analyzer.config.trace_dir} every {interval} s")
        analyzer.follow(interval, stop)
