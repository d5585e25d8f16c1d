"""One PostgreSQL connection of the broker's, that never holds its loop for long.

The broker's loop writes the journal and renews its lease on it. When PostgreSQL
stops, restarts or is cut off, a call must fail at once with the reason (guaranteed
jobs are then refused, plain ones keep flowing), not block the loop: a connection
attempt to an unreachable host takes libpq's ``connect_timeout`` (2 s at the
least), so a broken connection is replaced by a thread of its own, every
``RECONNECT_EVERY`` seconds, while calls raise ``JournalError`` meanwhile. A query on a
connection whose peer went silent fails after ``tcp_user_timeout`` (1 s) instead of
the kernel's minutes. psycopg is imported here only, when a URL is set (the
``postgres`` extra).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from emq_django.exceptions import JournalError

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger(__name__)

RECONNECT_EVERY = 0.5  # seconds between connection attempts while PostgreSQL is away
# libpq's parameters unless the URL gives its own: fail fast, notice a dead peer
CONNECT_DEFAULTS = {
    "connect_timeout": "2",  # libpq's minimum
    "tcp_user_timeout": "1000",  # ms: unacknowledged data this long breaks the link
    "keepalives": "1",
    "keepalives_idle": "1",
    "keepalives_interval": "1",
    "keepalives_count": "3",
}


def redact(url: str) -> str:
    """``url`` without its password (for errors and logs)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[-1]}"))


def import_psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - the extra is a dev dependency
        raise JournalError(
            "EMQ_JOURNAL_URL needs psycopg 3: pip install 'emq-django[postgres]'"
        ) from exc
    return psycopg


def connect(url: str, app: str, session: dict[str, str]) -> psycopg.Connection[Any]:
    """An autocommit connection with ``session`` settings (``SET``); raises
    ``JournalError`` naming the URL (without its password) and the reason."""
    pg = import_psycopg()
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    try:
        given = conninfo_to_dict(url)
    except pg.Error as exc:
        raise JournalError(f"EMQ_JOURNAL_URL {redact(url)} is not a PostgreSQL URL: {exc}") from exc
    extra = {k: v for k, v in CONNECT_DEFAULTS.items() if k not in given}
    extra.setdefault("application_name", app[:63])
    try:
        conn: psycopg.Connection[Any] = pg.connect(make_conninfo(url, **extra), autocommit=True)
    except pg.Error as exc:
        raise JournalError(f"PostgreSQL at {redact(url)}: {_reason(exc)}") from exc
    try:
        for name, value in session.items():
            conn.execute(f"SET {name} = '{value}'")  # noqa: S608 - our own constants
    except pg.Error as exc:
        conn.close()
        raise JournalError(f"PostgreSQL at {redact(url)}: {_reason(exc)}") from exc
    return conn


def _reason(exc: BaseException) -> str:
    """The first line of what libpq said (its messages run over several lines)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]


class PgLink:
    """A connection that is either up or being made again in the background."""

    def __init__(self, url: str, app: str, session: dict[str, str]) -> None:
        """Connects now: a wrong URL, a missing database or role, or PostgreSQL down
        raises ``JournalError`` here (the broker stops at start with it)."""
        self.url = url
        self.app = app
        self.session = session
        self._conn: psycopg.Connection[Any] | None = connect(url, app, session)
        self._fresh: psycopg.Connection[Any] | None = None  # made by the thread
        self._reason = ""  # why there is no connection
        self._thread: threading.Thread | None = None
        self._closed = False
        self.reconnects = 0

    @property
    def up(self) -> bool:
        return self._conn is not None or self._fresh is not None

    def get(self) -> psycopg.Connection[Any]:
        """The connection, or ``JournalError`` at once when there is none (a new one
        is being made meanwhile)."""
        if self._fresh is not None:
            self._conn, self._fresh = self._fresh, None
            self.reconnects += 1
            log.warning("PostgreSQL at %s is reachable again", redact(self.url))
        conn = self._conn
        if conn is None or conn.closed:
            self.broken(self._reason or "the connection is closed")
            raise JournalError(f"PostgreSQL at {redact(self.url)} unreachable: {self._reason}")
        return conn

    def failed(self, exc: BaseException) -> JournalError:
        """The error to raise for ``exc`` from a call on the connection; a broken
        connection is dropped and replaced in the background."""
        psycopg = import_psycopg()
        conn = self._conn
        lost = conn is None or conn.closed or bool(getattr(conn, "broken", False))
        lost = lost or isinstance(exc, psycopg.OperationalError) and _lost_link(conn)
        if lost:
            self.broken(_reason(exc))
            return JournalError(f"PostgreSQL at {redact(self.url)} unreachable: {_reason(exc)}")
        return JournalError(f"PostgreSQL at {redact(self.url)}: {_reason(exc)}")

    def broken(self, reason: str) -> None:
        """Drop the connection; a thread makes a new one."""
        conn, self._conn = self._conn, None
        if reason:
            self._reason = reason
        if conn is not None:
            log.error("PostgreSQL at %s: connection lost (%s)", redact(self.url), reason)
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - it is broken already
                pass
        if self._closed or (self._thread is not None and self._thread.is_alive()):
            return
        self._thread = threading.Thread(
            target=self._reconnect, name="emq-pg-reconnect", daemon=True
        )
        self._thread.start()

    def _reconnect(self) -> None:
        while not self._closed:
            started = time.monotonic()
            try:
                conn = connect(self.url, self.app, self.session)
            except JournalError as exc:
                self._reason = str(exc).split(": ", 1)[-1]
                time.sleep(max(0.0, RECONNECT_EVERY - (time.monotonic() - started)))
                continue
            if self._closed:
                conn.close()
            else:
                self._fresh = conn
            return

    def close(self) -> None:
        self._closed = True
        for conn in (self._conn, self._fresh):
            if conn is not None:
                try:
                    conn.close()
                except Exception:  # noqa: BLE001 - closing anyway
                    pass
        self._conn = self._fresh = None


def _lost_link(conn: Any) -> bool:
    """After an OperationalError: whether the connection itself is gone (as opposed
    to a statement that failed on a working connection, e.g. a lock timeout)."""
    if conn is None or conn.closed or conn.broken:
        return True
    from psycopg import pq

    return bool(conn.pgconn.status != pq.ConnStatus.OK)
