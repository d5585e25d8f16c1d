"""manage.py emq_demo: send a mix of the demo tasks until SIGINT/SIGTERM."""

import signal
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from project.demo.producer import DemoProducer, ProducerConfig


class Command(BaseCommand):
    help = "Sends a steady mix of the demo tasks (project.demo.tasks) until stopped."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--rate", type=float, default=4.0, help="jobs per second (4)")
        parser.add_argument(
            "--count", type=int, default=0, help="stop after this many jobs (0: run until stopped)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["rate"] <= 0:
            raise CommandError("--rate must be greater than 0")
        producer = DemoProducer(ProducerConfig(rate=options["rate"], count=options["count"]))

        def stop(signum: int, frame: FrameType | None) -> None:
            producer.stop()

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        producer.run()
