"""The roles a key may hold, and how a bound socket names the roles it admits.

A socket's ZAP domain is the roles it admits, joined by commas (``client,scheduler``
on the eMQP clients port), or ``any`` (any enabled key) when a port names none.
The ZAP handler admits a key holding one of them; where one socket carries
several roles, the server checks each message's command against its sender's
roles too (``Port.authorize``).
"""

from __future__ import annotations

from collections.abc import Iterable

CLIENT = "client"  # eMQP clients port, Majordomo clients, PZQ producers
WORKER = "worker"  # eMQP workers port (job managers), Majordomo workers, PZQ consumers
SCHEDULER = "scheduler"  # INFORMs as a scheduler on the clients port
MONITOR = "monitor"  # reads the monitor channel (MONITOR, DEADLETTERS LIST)
ADMIN = "admin"  # CANCEL and the dead-letter commands that change something
PUBLISHER = "publisher"
SUBSCRIBER = "subscriber"
ROLES: tuple[str, ...] = (CLIENT, WORKER, SCHEDULER, MONITOR, ADMIN, PUBLISHER, SUBSCRIBER)
ANY = "any"


def zap_domain(roles: Iterable[str]) -> str:
    """The ZAP domain of a socket admitting ``roles``."""
    return ",".join(sorted(set(roles))) or ANY


def domain_roles(domain: str) -> frozenset[str] | None:
    """The roles a ZAP domain admits; None: any enabled key."""
    if domain in ("", ANY):
        return None
    return frozenset(domain.split(","))


def parse_roles(text: str | Iterable[str]) -> tuple[str, ...]:
    """Roles from ``client,worker`` (or a list); raises ``ValueError`` naming an
    unknown one."""
    items = text.split(",") if isinstance(text, str) else list(text)
    roles = tuple(sorted({r.strip().lower() for r in items if r.strip()}))
    unknown = [r for r in roles if r not in ROLES]
    if unknown:
        raise ValueError(f"unknown role(s) {', '.join(unknown)}; roles are {', '.join(ROLES)}")
    return roles
