"""``manage.py emq_trace_synth --jobs N``: realistic synthetic trace files."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from emq_django.analytics.synth import SynthConfig, generate, write_trace
from emq_django.conf import get_settings

from .emq_analyze import parse_time


class Command(BaseCommand):
    help = (
        "Write synthetic trace files (several queues and tasks, log-normal run times, "
        "failures, retries, timeouts) in the broker's format, for emq_analyze."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--jobs", type=int, required=True, help="how many jobs")
        parser.add_argument("--out", help="directory (default EMQ_TRACE_DIR)")
        parser.add_argument("--rate", type=float, default=50.0, help="jobs per second")
        parser.add_argument(
            "--start", type=parse_time, help="first arrival, UTC (default: so the last is now)"
        )
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--drop-rate", type=float, default=0.0, help="events to leave out")

    def handle(self, *args: Any, **opts: Any) -> None:
        out = opts["out"] or get_settings().TRACE_DIR
        if not out:
            raise CommandError("no output directory: pass --out or set EMQ_TRACE_DIR")
        if opts["jobs"] < 0 or opts["rate"] <= 0:
            raise CommandError("--jobs must be >= 0 and --rate > 0")
        start = (
            opts["start"].timestamp()
            if opts["start"]
            else time.time() - opts["jobs"] / opts["rate"]
        )
        cfg = SynthConfig(jobs=opts["jobs"], start=start, rate=opts["rate"], seed=opts["seed"])
        cfg = replace(cfg, drop_rate=opts["drop_rate"])
        counts = write_trace(generate(cfg), Path(out))
        total = sum(counts.values())
        self.stdout.write(
            f"wrote {total} events of {opts['jobs']} jobs to {len(counts)} files in {out}"
        )
