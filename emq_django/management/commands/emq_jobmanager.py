"""``manage.py emq_jobmanager --queues email:40,default:10 --concurrency 4``."""

from __future__ import annotations

import logging
import os
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from emq_django import registry
from emq_django.conf import get_settings
from emq_django.logconfig import configure_command_logging
from emq_django.worker.jobmanager import JobManager, JobManagerConfig, parse_queue_option

log = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Run a job manager: a pool of worker processes that run registered tasks."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--queues", default="default:10", help="queues and weights, e.g. email:40,default:10"
        )
        parser.add_argument(
            "--concurrency",
            type=int,
            default=os.cpu_count() or 1,
            help="worker processes (default: CPU count)",
        )
        parser.add_argument(
            "--max-concurrency",
            type=int,
            default=0,
            help="the most worker processes the admin's resize may ask for "
            "(default: the larger of --concurrency and 64)",
        )
        parser.add_argument(
            "--broker",
            help="broker's job manager address (default EMQ_WORKER_URL, tcp://127.0.0.1:47290)",
        )
        parser.add_argument("--name", default="", help="name shown in the monitor")
        parser.add_argument("--prefetch", type=int, help="jobs each worker may hold (default 1)")
        parser.add_argument(
            "--max-jobs-per-worker",
            type=int,
            default=0,
            help="restart a worker process after this many jobs (0: never)",
        )
        parser.add_argument(
            "--max-memory-per-worker",
            type=int,
            default=0,
            metavar="MB",
            help="restart a worker process once it has grown past this (0: never)",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        configure_command_logging(opts["verbosity"], get_settings().LOG_FORMAT)
        try:
            queues = parse_queue_option(opts["queues"])
        except ValueError as exc:
            raise CommandError(f"--queues: {exc}") from exc
        if opts["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1")
        if opts["max_concurrency"] < 0:
            raise CommandError("--max-concurrency must be at least 0 (0: the default)")
        settings = get_settings(worker_url=opts["broker"], prefetch=opts["prefetch"])
        try:
            names = registry.autodiscover(settings.IMPORTS)
        except ImportError as exc:
            raise CommandError(str(exc)) from exc
        log.info("registered tasks: %s", ", ".join(names) or "(none)")
        config = JobManagerConfig(
            broker_url=settings.WORKER_URL,
            queues=queues,
            concurrency=opts["concurrency"],
            max_concurrency=opts["max_concurrency"],
            heartbeat_interval=settings.HEARTBEAT_INTERVAL,
            heartbeat_liveness=settings.HEARTBEAT_LIVENESS,
            prefetch=settings.PREFETCH,
            name=opts["name"],
            max_jobs_per_worker=opts["max_jobs_per_worker"],
            recorder=settings.RECORDER,
            record_interval=settings.RECORD_INTERVAL,
            record_batch=settings.RECORD_BATCH,
            record_buffer=settings.RECORD_BUFFER,
            recorder_priority=settings.RECORDER_PRIORITY,
            recorder_max_delay=settings.RECORDER_MAX_DELAY,
            max_memory_mb=opts["max_memory_per_worker"],
            kill_grace=settings.KILL_GRACE,
        )
        code = JobManager(config).run()
        if code:
            raise SystemExit(code)
