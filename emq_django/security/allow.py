"""The broker's allow-list: which public keys may connect, under which name and
roles. Held in memory and replaced whole (one attribute assignment, atomic under
the GIL), so the ZAP handler and the server loop read it without a lock and never
touch the database; ``KeyReloader`` refreshes it in the background.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KeyEntry:
    """One authorized key (its public key in Z85)."""

    name: str
    public_key: str
    roles: frozenset[str]
    enabled: bool = True


@dataclass(frozen=True, slots=True)
class _Snapshot:
    by_key: dict[str, KeyEntry]
    roles_by_name: dict[str, frozenset[str]]  # enabled keys only: the User-Id check


class AllowList:
    """The keys the broker admits. ``version`` grows at every change that took
    something away (a key disabled, deleted or given fewer roles)."""

    def __init__(self, entries: Iterable[KeyEntry] = ()) -> None:
        self._snap = _Snapshot({}, {})
        self.version = 0
        self.seen: set[str] = set()  # names admitted or heard from since the last flush
        # roles some key lost since the server last asked (``take_lost_roles``): the
        # publisher sockets of those roles are bound again (a PUB cannot skip a peer)
        self.lost_roles: set[str] = set()
        self.replace(entries)

    def replace(self, entries: Iterable[KeyEntry]) -> bool:
        """Swap the list; True when some access was taken away."""
        by_key = {e.public_key: e for e in entries}
        roles = {e.name: e.roles for e in by_key.values() if e.enabled}
        old = self._snap.roles_by_name
        narrowed = any(name not in roles or not r <= roles[name] for name, r in old.items())
        self._snap = _Snapshot(by_key, roles)
        if narrowed:
            # "" when only a key without roles went (it may hold no role-less socket)
            lost = set().union(*(r - roles.get(name, frozenset()) for name, r in old.items()))
            self.lost_roles = self.lost_roles | (lost or {""})  # a new set: the loop swaps it
            self.version += 1
        return narrowed

    def entry(self, public_key: str) -> KeyEntry | None:
        return self._snap.by_key.get(public_key)

    def roles(self, name: str) -> frozenset[str] | None:
        """The roles of the enabled key named ``name`` (a User-Id); None: revoked."""
        return self._snap.roles_by_name.get(name)

    def names(self) -> list[str]:
        """The names of the enabled keys."""
        return list(self._snap.roles_by_name)

    def take_lost_roles(self) -> set[str]:
        lost, self.lost_roles = self.lost_roles, set()
        return lost

    def take_seen(self) -> set[str]:
        seen, self.seen = self.seen, set()
        return seen


Loader = Callable[[], list[KeyEntry]]
Saver = Callable[[set[str], float], None]


class KeyReloader:
    """Reloads the allow-list every ``interval`` seconds in a thread, and writes the
    names seen since the last time (``last seen``, one batch per reload).
    ``on_narrowed`` runs (in that thread) when access was taken away."""

    def __init__(
        self,
        allow: AllowList,
        load: Loader,
        save_seen: Saver | None,
        interval: float,
        on_narrowed: Callable[[], None] = lambda: None,
    ) -> None:
        self.allow = allow
        self.load = load
        self.save_seen = save_seen
        self.interval = interval
        self.on_narrowed = on_narrowed
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="emq-keys", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def reload_once(self) -> None:
        try:
            entries = self.load()
        except Exception as exc:  # the database may be away: keep the list we have
            self.errors += 1
            log.warning("could not reload the authorized keys (keeping the old list): %s", exc)
        else:
            if self.allow.replace(entries):
                log.info("authorized keys reloaded: access taken away; dropping their peers")
                self.on_narrowed()
        seen = self.allow.take_seen()
        if seen and self.save_seen is not None:
            try:
                self.save_seen(seen, time.time())
            except Exception as exc:
                self.errors += 1
                log.warning("could not record when keys were last seen: %s", exc)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.reload_once()
