"""``manage.py emq_tail /orders/ [--since N]``: print the topic space's events as
they come (sequence, topic, data), through the broker's Event BUS port."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand

from emq_django.exceptions import EventsExpired
from emq_django.pubsub import Received, subscribe


def show(event: Received) -> str:
    data = event.data
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = "0x" + data.hex()
    else:
        text = json.dumps(data, default=repr, ensure_ascii=False)
    return f"{event.seq} {event.topic} {text}"


class Command(BaseCommand):
    help = "Print the events on topics under the given prefixes as they are published."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("prefixes", nargs="*", default=[], help="topic prefixes (all)")
        parser.add_argument(
            "--since",
            type=int,
            default=None,
            help="first print the kept events above this sequence number (0: all kept)",
        )
        parser.add_argument("--count", type=int, default=0, help="exit after this many")
        parser.add_argument("--snapshot", help="snapshot address (EMQ_BUS_SNAPSHOT_URL)")
        parser.add_argument("--publisher", help="publisher address (EMQ_BUS_PUBLISH_URL)")

    def handle(self, *args: Any, **opts: Any) -> None:
        n = 0
        with subscribe(
            opts["prefixes"] or [""],
            opts["since"],
            snapshot_url=opts["snapshot"],
            publish_url=opts["publisher"],
        ) as events:
            while True:
                try:
                    for event in events:
                        self.stdout.write(show(event))
                        self.stdout.flush()
                        n += 1
                        if opts["count"] and n >= opts["count"]:
                            return
                except EventsExpired as exc:  # said, and the tail goes on after them
                    self.stderr.write(f"emq_tail: {exc}")
                except KeyboardInterrupt:
                    return
