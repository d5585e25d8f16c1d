"""``manage.py emq_scheduler``: run a scheduler (several may run at once)."""

from __future__ import annotations

import logging
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from emq_django.logconfig import configure_command_logging
from emq_django.scheduler.timing import CATCH_UP_POLICIES

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Run the emq scheduler: fire the ScheduledJob rows as jobs, store SCHEDULE/UNSCHEDULE."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--broker", help="the broker's client address (default EMQ_BROKER_URL)")
        parser.add_argument(
            "--catch-up",
            choices=CATCH_UP_POLICIES,
            help="ticks missed while no scheduler ran: one run (once, the default), "
            "none, or one per tick (all); default EMQ_SCHEDULER_CATCH_UP",
        )
        parser.add_argument(
            "--poll",
            type=float,
            help="seconds between database checks (default EMQ_SCHEDULER_POLL, 0.5)",
        )
        parser.add_argument(
            "--no-sync",
            action="store_true",
            help="do not store the @emq.periodic schedules at start",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        from django.core.exceptions import ImproperlyConfigured

        from emq_django import registry
        from emq_django.conf import get_settings
        from emq_django.scheduler.api import sync_periodic
        from emq_django.scheduler.config import load_config
        from emq_django.scheduler.peer import SchedulerPeer

        configure_command_logging(opts["verbosity"], get_settings().LOG_FORMAT)
        try:
            config = load_config(
                broker_url=opts["broker"], catch_up=opts["catch_up"], poll_interval=opts["poll"]
            )
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        registry.autodiscover(get_settings().IMPORTS)
        if not opts["no_sync"]:
            stored, removed = sync_periodic()
            if stored or removed:
                log.info("@emq.periodic: %d stored, %d removed", stored, removed)
        code = SchedulerPeer(config).run()
        if code:
            raise SystemExit(code)
