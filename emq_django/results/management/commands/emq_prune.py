"""``manage.py emq_prune``: delete job history older than EMQ_RESULTS_RETENTION now.

Recorders prune by themselves every EMQ_RESULTS_PRUNE_INTERVAL; this is for a
cron job when no job manager runs, or to apply a shorter ``--older-than``.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import connections

from emq_django.results.conf import results_settings
from emq_django.results.pruning import prune


class Command(BaseCommand):
    help = "Delete job results that finished longer ago than the retention (seconds)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=float,
            default=None,
            help="seconds; default EMQ_RESULTS_RETENTION",
        )
        parser.add_argument("--database", default="default")

    def handle(self, *args: Any, **options: Any) -> None:
        retention = options["older_than"] or results_settings().retention
        deleted = prune(connections[options["database"]], retention)
        self.stdout.write(f"deleted {deleted} job results older than {retention:g} s")
