"""Reading the allow-list from the database, and writing ``last_seen``: the
broker's reloader thread calls these (``security/allow.py``), off its hot path."""

from __future__ import annotations

import datetime as dt
import logging

from django.db import close_old_connections, connection

from emq_django.security.allow import KeyEntry

log = logging.getLogger(__name__)


def load_authorized_keys() -> list[KeyEntry]:
    """Every ``AuthorizedKey`` (disabled ones too: the ZAP handler says why it
    refuses them). A row with bad roles is skipped and logged."""
    from emq_django.security.models import AuthorizedKey

    close_old_connections()
    entries = []
    try:
        for key in AuthorizedKey.objects.all():
            try:
                roles = key.role_set()
            except ValueError as exc:
                log.warning("authorized key %r skipped: %s", key.name, exc)
                continue
            entries.append(KeyEntry(key.name, key.public_key, roles, key.enabled))
    finally:
        connection.close()  # a thread of its own: nothing keeps it between reloads
    return entries


def save_last_seen(names: set[str], when: float) -> None:
    """One UPDATE for every key seen since the last reload."""
    from emq_django.security.models import AuthorizedKey

    try:
        stamp = dt.datetime.fromtimestamp(when, tz=dt.UTC)
        AuthorizedKey.objects.filter(name__in=names).update(last_seen=stamp)
    finally:
        connection.close()
