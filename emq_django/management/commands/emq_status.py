"""``manage.py emq_status``: the broker's monitor document as tables."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from emq_django.conf import get_settings
from emq_django.exceptions import BrokerUnavailable
from emq_django.monitor_client import status


def _table(rows: list[list[Any]], headers: list[str]) -> str:
    cells = [headers] + [["" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _ago(ts: float | None, now: float) -> str:
    return "-" if ts is None else f"{max(0.0, now - ts):.1f}s ago"


def _ha(ha: dict[str, Any], now: float) -> list[str]:
    """The lease (``EMQ_JOURNAL_URL``): who answered, who is active, the last
    failover, and every broker sharing the journal."""
    expires = ha.get("expires_in")
    out = [
        "",
        "High availability",
        f"this broker: {ha.get('name')} ({ha.get('role')}); active: {ha.get('active') or 'none'}"
        f", epoch {ha.get('epoch')}"
        + (f", lease expires in {expires:.2f} s" if isinstance(expires, int | float) else ""),
    ]
    failover = ha.get("last_failover")
    if failover:
        took = failover.get("took_s")
        out.append(
            f"last failover: {failover.get('from')} -> {failover.get('to')}, "
            f"{_ago(failover.get('at'), now)}"
            + (f", took {took:.3f} s" if isinstance(took, int | float) else "")
        )
    else:
        out.append("last failover: none")
    if ha.get("error"):
        out.append(f"PostgreSQL: {ha['error']}")
    rows = [
        [
            b.get("name"),
            b.get("role"),
            (b.get("info") or {}).get("host"),
            (b.get("info") or {}).get("pid"),
            (b.get("info") or {}).get("frontend"),
            (b.get("info") or {}).get("monitor"),
            f"{b.get('seen_ago', 0):.1f}s ago",
        ]
        for b in ha.get("brokers") or []
    ]
    if rows:
        out.append(
            _table(rows, ["broker", "role", "host", "pid", "frontend", "monitor", "last seen"])
        )
    return out


class Command(BaseCommand):
    help = "Show the broker's queues, job managers and counters."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--monitor", help="monitor address (default EMQ_MONITOR_URL)")
        parser.add_argument("--json", action="store_true", help="print the raw document")
        parser.add_argument("--timeout", type=float, default=None)

    def handle(self, *args: Any, **opts: Any) -> None:
        settings = get_settings(monitor_url=opts["monitor"])
        try:
            doc = status(settings.MONITOR_URL, opts["timeout"] or settings.MONITOR_TIMEOUT)
        except BrokerUnavailable as exc:
            raise CommandError(str(exc)) from exc
        if opts["json"]:
            self.stdout.write(json.dumps(doc, indent=2))
            return
        self.stdout.write(self.render(doc))

    @staticmethod
    def render(doc: dict[str, Any]) -> str:
        now = doc["broker"].get("time") or dt.datetime.now().timestamp()
        b = doc["broker"]
        out = [
            f"broker pid {b.get('pid')} on {b.get('host')}, up {b.get('uptime')} s"
            f"{' (stopping)' if b.get('stopping') else ''}",
        ]
        if doc.get("ha"):
            out += _ha(doc["ha"], now)
        out += ["", "Queues"]
        out.append(
            _table(
                [
                    [
                        q["name"],
                        q["depth"],
                        q["in_flight"],
                        ", ".join(
                            f"{m['identity']} (w{m['weight']}, {m['free_slots']} free)"
                            for m in q["job_managers"]
                        )
                        or "-",
                    ]
                    for q in doc["queues"]
                ],
                ["queue", "depth", "in flight", "job managers"],
            )
        )
        out += ["", "Job managers"]
        out.append(
            _table(
                [
                    [
                        m["identity"],
                        m.get("host"),
                        m.get("pid"),
                        ",".join(f"{n}:{w}" for w, n in m["queues"]),
                        m["slots"],
                        m["busy"],
                        m["free_slots"],
                        m["jobs_done"],
                        _ago(m["last_heartbeat"], now),
                    ]
                    for m in doc["job_managers"]
                ],
                [
                    "job manager",
                    "host",
                    "pid",
                    "queues",
                    "slots",
                    "busy",
                    "free",
                    "done",
                    "last heartbeat",
                ],
            )
        )
        if doc.get("schedulers"):
            out += ["", "Schedulers"]
            out.append(
                _table(
                    [
                        [s["identity"], s.get("host"), s.get("pid"), _ago(s["last_heartbeat"], now)]
                        for s in doc["schedulers"]
                    ],
                    ["scheduler", "host", "pid", "last heartbeat"],
                )
            )
        out += ["", "Counters"]
        out.append(_table([[k, v] for k, v in doc["counters"].items()], ["counter", "value"]))
        return "\n".join(out) + "\n"
