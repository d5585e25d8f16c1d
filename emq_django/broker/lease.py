"""The active broker's lease on a shared PostgreSQL journal, with its fencing token.

Brokers sharing one journal (``EMQ_JOURNAL_URL``) take turns: exactly one holds the
lease row of ``emq_lease`` and serves; the others are standbys that take it once it
has expired. Expiry is judged by PostgreSQL's clock alone (``clock_timestamp()``),
so the brokers' clocks never need to agree. Each taking increments the epoch, the
fencing token: the journal writes only with the epoch it was given
(``PgJournal.fence``), so a broker that lost the lease while paused or cut off
cannot commit (and so cannot acknowledge a guaranteed job) once another took over.

Two brokers racing for an expired lease are serialised by the row: the upsert's
condition is evaluated again on the row's newest version after the lock, so only
one of them gets it. The lease's connection is its own (autocommit), apart from
the journal's, so a standby can poll without a journal open.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from typing import TYPE_CHECKING, Any

from emq_django.broker.pglink import PgLink, import_psycopg

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

LEASE_SCHEMA = """
CREATE TABLE IF NOT EXISTS emq_lease (
    id integer PRIMARY KEY CHECK (id = 1),  -- one lease per journal
    name text NOT NULL,                     -- the holder
    epoch bigint NOT NULL,                  -- the fencing token: +1 at each taking
    expires_at timestamptz NOT NULL,        -- PostgreSQL's clock
    since timestamptz NOT NULL,             -- when the holder took it
    served_at timestamptz,                  -- when the holder served (mark_serving)
    last_from text,                         -- the last taking: from whom
    last_to text,
    last_expired_at timestamptz,            -- when the previous holder's lease expired
    last_taken_at timestamptz,
    last_took_s double precision            -- the failover's duration (mark_serving)
);
CREATE TABLE IF NOT EXISTS emq_brokers (
    name text PRIMARY KEY,
    role text NOT NULL,
    info jsonb NOT NULL,
    seen_at timestamptz NOT NULL
);
"""
# serialises the CREATE TABLEs of brokers starting together (they would race in
# the catalog otherwise): an advisory lock number of our own
SCHEMA_LOCK = 0x656D71  # "emq"
# a broker not seen for this long is left out of ``state()``'s brokers (and deleted)
FORGET_BROKER_S = 3600.0
LISTED_BROKER_S = 60.0
# a standby waits this long for the lease row (locked by the active's commit)
# before it tries again at its next poll
SESSION = {"lock_timeout": "500ms", "idle_in_transaction_session_timeout": "5s"}

TAKE = """
INSERT INTO emq_lease (id, name, epoch, expires_at, since)
VALUES (1, %(name)s, 1, clock_timestamp() + make_interval(secs => %(ttl)s), clock_timestamp())
ON CONFLICT (id) DO UPDATE SET
    name = excluded.name,
    epoch = emq_lease.epoch + 1,
    expires_at = excluded.expires_at,
    since = excluded.since,
    served_at = NULL,
    last_from = emq_lease.name,
    last_to = excluded.name,
    last_expired_at = emq_lease.expires_at,
    last_taken_at = excluded.since,
    last_took_s = NULL
WHERE emq_lease.expires_at <= clock_timestamp()
RETURNING epoch
"""
RENEW = (
    "UPDATE emq_lease SET expires_at = clock_timestamp() + make_interval(secs => %s)"
    " WHERE id = 1 AND name = %s AND epoch = %s"
)


def default_name() -> str:
    """``EMQ_BROKER_NAME``'s default: hostname-pid."""
    return f"{socket.gethostname()}-{os.getpid()}"


def ensure_schema(conn: psycopg.Connection[Any], schema: str) -> None:
    """Create ``schema``'s tables if missing, one broker at a time."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
        conn.execute(schema)


class Lease:
    """This broker's side of the lease: take it, renew it, give it back."""

    def __init__(self, url: str, name: str, ttl: float, info: dict[str, Any] | None = None) -> None:
        """Connects and creates the tables; ``JournalError`` if PostgreSQL refuses."""
        self.url = url
        self.name = name or default_name()
        self.ttl = float(ttl)
        self.info = dict(info or {})
        self.epoch: int | None = None  # ours while held
        self.link = PgLink(url, f"emq-broker lease {self.name}", SESSION)
        try:
            self._run(lambda c: ensure_schema(c, LEASE_SCHEMA))
        except BaseException:
            self.link.close()
            raise

    def _run(self, call: Any) -> Any:
        psycopg = import_psycopg()
        conn = self.link.get()
        try:
            return call(conn)
        except psycopg.Error as exc:
            raise self.link.failed(exc) from exc

    def try_acquire(self) -> int | None:
        """Take the lease if nobody holds it or its holder's expired (by PostgreSQL's
        clock): returns the new epoch, or None (held by another; or its row is
        locked by the holder's commit at this moment: try again at the next poll).
        ``JournalError``: PostgreSQL unreachable."""
        psycopg = import_psycopg()

        def take(conn: Any) -> int | None:
            try:
                row = conn.execute(TAKE, {"name": self.name, "ttl": self.ttl}).fetchone()
            except psycopg.errors.LockNotAvailable:
                return None
            return None if row is None else int(row[0])

        epoch: int | None = self._run(take)
        if epoch is not None:
            self.epoch = epoch
            log.warning("broker %s took the lease: epoch %d", self.name, epoch)
        return epoch

    def renew(self) -> bool:
        """Extend the lease by the TTL from now. False: it is no longer ours (another
        broker took it: a higher epoch); ``JournalError``: PostgreSQL unreachable
        (whether it is still ours is not known: ask again when it is back)."""
        epoch = self.epoch
        if epoch is None:
            return False
        rows = self._run(lambda c: c.execute(RENEW, (self.ttl, self.name, epoch)).rowcount)
        if rows != 1:
            log.error("broker %s lost the lease (epoch %d)", self.name, epoch)
            self.epoch = None
            return False
        return True

    def release(self) -> None:
        """Give the lease back at a clean shutdown: it expires now, so a standby takes
        over at its next poll instead of waiting out the TTL."""
        epoch, self.epoch = self.epoch, None
        if epoch is None:
            return
        self._run(
            lambda c: c.execute(
                "UPDATE emq_lease SET expires_at = clock_timestamp()"
                " WHERE id = 1 AND name = %s AND epoch = %s",
                (self.name, epoch),
            )
        )

    def mark_serving(self, took_s: float | None = None) -> None:
        """The new active serves: record when, and the failover's duration (``took_s``,
        or, when not given, from the previous holder's expiry to now)."""
        epoch = self.epoch
        if epoch is None:
            return
        self._run(
            lambda c: c.execute(
                "UPDATE emq_lease SET served_at = clock_timestamp(), last_took_s = CASE"
                " WHEN last_to IS NULL THEN NULL"
                " ELSE COALESCE(%s, EXTRACT(EPOCH FROM clock_timestamp() - last_expired_at))"
                " END WHERE id = 1 AND name = %s AND epoch = %s",
                (took_s, self.name, epoch),
            )
        )

    def announce(self, role: str) -> None:
        """Record this broker (active or standby) with its ``info`` and the time."""
        self._run(
            lambda c: c.execute(
                "INSERT INTO emq_brokers (name, role, info, seen_at)"
                " VALUES (%s, %s, %s, clock_timestamp()) ON CONFLICT (name) DO UPDATE SET"
                " role = excluded.role, info = excluded.info, seen_at = excluded.seen_at",
                (self.name, role, json.dumps(self.info)),
            )
        )

    def state(self) -> dict[str, Any]:
        """The lease as PostgreSQL has it: the active broker, the epoch, the seconds
        until it expires, since when it is held, the last failover and the brokers
        seen lately (``announce``)."""
        return dict(self._run(_state))

    def close(self) -> None:
        self.link.close()


def _state(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    row = conn.execute(
        "SELECT name, epoch, EXTRACT(EPOCH FROM expires_at - clock_timestamp()),"
        " EXTRACT(EPOCH FROM since), last_from, last_to, EXTRACT(EPOCH FROM last_taken_at),"
        " last_took_s FROM emq_lease WHERE id = 1"
    ).fetchone()
    conn.execute(
        "DELETE FROM emq_brokers WHERE seen_at < clock_timestamp() - make_interval(secs => %s)",
        (FORGET_BROKER_S,),
    )
    brokers = [
        {"name": name, "role": role, "seen_ago": round(float(ago), 3), "info": info}
        for name, role, ago, info in conn.execute(
            "SELECT name, role, EXTRACT(EPOCH FROM clock_timestamp() - seen_at), info"
            " FROM emq_brokers WHERE seen_at > clock_timestamp() - make_interval(secs => %s)"
            " ORDER BY name",
            (LISTED_BROKER_S,),
        )
    ]
    if row is None:
        return {
            "active": None,
            "epoch": 0,
            "expires_in": None,
            "since": None,
            "last_failover": None,
            "brokers": brokers,
        }
    name, epoch, expires_in, since, last_from, last_to, taken_at, took_s = row
    failover = None
    if last_to is not None:
        failover = {
            "from": last_from,
            "to": last_to,
            "at": float(taken_at),
            "took_s": None if took_s is None else round(float(took_s), 3),
        }
    return {
        "active": name if float(expires_in) > 0 else None,
        "holder": name,
        "epoch": int(epoch),
        "expires_in": round(float(expires_in), 3),
        "since": float(since),
        "last_failover": failover,
        "brokers": brokers,
    }
