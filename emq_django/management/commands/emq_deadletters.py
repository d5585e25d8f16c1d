"""``manage.py emq_deadletters list|requeue|purge [--all | JOB_ID ...]``."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from emq_django.conf import get_settings
from emq_django.exceptions import BrokerUnavailable
from emq_django.monitor_client import query


class Command(BaseCommand):
    help = "List, requeue or purge the jobs that used up their retries (the dead letters)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("action", choices=["list", "requeue", "purge"])
        parser.add_argument("job_ids", nargs="*", help="the jobs to requeue or purge")
        parser.add_argument("--all", action="store_true", help="every dead letter")
        parser.add_argument("--monitor", help="monitor address (default EMQ_MONITOR_URL)")
        parser.add_argument("--json", action="store_true", help="print the raw answer")

    def handle(self, *args: Any, **opts: Any) -> None:
        action: str = opts["action"]
        ids: list[str] = opts["job_ids"]
        if action != "list" and not ids and not opts["all"]:
            raise CommandError(f"{action}: name the jobs, or give --all")
        if any(not i.isprintable() or " " in i for i in ids):
            raise CommandError("job ids are printable and contain no spaces")
        words = ["DEADLETTERS", action.upper(), *(["ALL"] if opts["all"] else ids)]
        settings = get_settings(monitor_url=opts["monitor"])
        try:
            answer = query(settings.MONITOR_URL, " ".join(words).encode(), settings.MONITOR_TIMEOUT)
        except BrokerUnavailable as exc:
            raise CommandError(str(exc)) from exc
        if answer.startswith(b"ERROR"):
            raise CommandError(answer.decode(errors="replace"))
        doc = json.loads(answer)
        if opts["json"]:
            self.stdout.write(json.dumps(doc, indent=2))
        elif action == "list":
            self.stdout.write(f"{doc['count']} dead letters")
            for letter in doc["dead_letters"]:
                self.stdout.write(
                    f"{letter['id']}  {letter['task'] or '-'}  queue={letter['queue']}  "
                    f"attempts={letter['attempts']}  error={letter['error']}"
                )
        else:
            self.stdout.write(f"{action}d {doc.get(action + 'd', 0)} dead letters")
