"""An active/standby broker process: the life around the server loop when the
journal is in PostgreSQL (``EMQ_JOURNAL_URL``).

The process starts as a standby: a ``BrokerServer`` with only the monitor port
(``StandbyMonitorPort``: ``MONITOR JSON`` tells its role and names the active
broker), whose loop tries to take the lease every ``EMQ_LEASE_POLL``
(``StandbyWatch``). Once it has the lease it closes that server, restores the
journal from PostgreSQL (fenced with its epoch: each commit renews the lease, and
fails with ``LeaseLost`` once the lease is another broker's), binds every port
and serves (``ActiveWatch`` renews every ``EMQ_LEASE_RENEW``). It records when it
served (``Lease.mark_serving``: the failover's duration).

When the active loop leaves because the lease is lost (renewal refused, a commit
fenced off, after a pause or a partition longer than the TTL), every socket is
closed with linger 0, the loop's state is dropped (the journal holds what
counts, and the new active broker restored it) and the process goes back to
standby by itself. SIGTERM: the graceful shutdown as without a lease, then
``Lease.release()`` so that a standby takes over at once.
"""

from __future__ import annotations

import logging
import os
import socket as pysocket
import threading
import time
from dataclasses import replace
from typing import Any

from emq_django.broker.journal_pg import PgJournal
from emq_django.broker.lease import Lease
from emq_django.broker.lease_watch import ActiveWatch, LeaseWatch, StandbyWatch
from emq_django.broker.ports import PORTS
from emq_django.broker.ports.monitor import StandbyMonitorPort
from emq_django.broker.server import BrokerServer
from emq_django.conf import EmqSettings
from emq_django.exceptions import JournalError
from emq_django.security.allow import Loader, Saver

log = logging.getLogger(__name__)

# ms a stepping-down broker gives the refusals of its last turn (guaranteed jobs
# whose commit was fenced off) to leave before its sockets are dropped; nothing
# else waits to go then, since the loop left before reading anything more
STEP_DOWN_LINGER_MS = 100


def broker_name(settings: EmqSettings) -> str:
    """``EMQ_BROKER_NAME``, else ``hostname-pid``."""
    return settings.BROKER_NAME or f"{pysocket.gethostname()}-{os.getpid()}"


def broker_info(settings: EmqSettings) -> dict[str, Any]:
    """What the other brokers and the monitor see of this one: where it serves."""
    info: dict[str, Any] = {"host": pysocket.gethostname(), "pid": os.getpid()}
    for setting, port in PORTS:
        address = getattr(settings, setting, "")
        if address:
            info[port.name] = address
    return info


class HaBroker:
    """One broker process under a lease: standby, active, standby again, ..."""

    def __init__(
        self,
        settings: EmqSettings,
        lease: Lease | None = None,
        load_keys: Loader | None = None,
        save_seen: Saver | None = None,
    ) -> None:
        """Raises ``JournalError`` when PostgreSQL refuses (a wrong URL, no such
        database, no permission): the broker does not start. ``load_keys`` and
        ``save_seen``: as ``BrokerServer``'s (CURVE's allow-list), given to each
        server this process runs, standby and active."""
        self.settings = settings
        self.load_keys = load_keys
        self.save_seen = save_seen
        self.name = broker_name(settings)
        self.lease = lease or Lease(
            settings.JOURNAL_URL, self.name, settings.LEASE_TTL, broker_info(settings)
        )
        # the servers open no journal: the active one is given PostgreSQL's, fenced
        self.server_settings = replace(settings, JOURNAL_PATH="", JOURNAL_URL="")
        self.stop_requests = 0
        self.current: BrokerServer | None = None
        self.step_downs = 0

    def run(self) -> None:
        """Standby, then active, until SIGTERM. Raises ``zmq.ZMQError`` or
        ``ImproperlyConfigured`` when a port cannot be bound (the lease is
        released first)."""
        while not self.stop_requests:
            epoch = self._standby()
            if epoch is None:
                return
            reason = self._active(epoch, time.monotonic())
            if reason is None:
                return
            self.step_downs += 1
            log.warning("broker %s steps down to standby: %s", self.name, reason)

    # ---- the two roles ---------------------------------------------------------------

    def _standby(self) -> int | None:
        """Serve the monitor as a standby until the lease is ours (its epoch) or a
        signal stops the process (None)."""
        watch = StandbyWatch(self.lease, self.name, self.settings.LEASE_POLL)
        server = BrokerServer(
            self.server_settings,
            ports=[("MONITOR_BIND", StandbyMonitorPort)],
            ha=watch,
            load_keys=self.load_keys,
            save_seen=self.save_seen,
        )
        log.info("broker %s is a standby (monitor on %s)", self.name, server.info.get("monitor"))
        left = self._serve(server, watch)
        return watch.epoch if left is not None else None

    def _active(self, epoch: int, taken_at: float) -> str | None:
        """Restore the journal, bind and serve under ``epoch``; the reason it left
        (the lease lost), or None when stopped by a signal (the lease released)."""
        log.info("broker %s took the lease (epoch %d): restoring the journal", self.name, epoch)
        journal: PgJournal | None = None
        try:
            with _Renewing(self.lease, self.settings.LEASE_RENEW):  # a long restore
                journal = PgJournal(self.settings.JOURNAL_URL, name=self.name)
                journal.fence(epoch, self.settings.LEASE_TTL)
                watch = ActiveWatch(self.lease, self.name, self.settings.LEASE_RENEW, epoch)
                server = BrokerServer(
                    self.server_settings,
                    journal=journal,
                    ha=watch,
                    load_keys=self.load_keys,
                    save_seen=self.save_seen,
                )
        except JournalError as exc:
            if journal is not None:
                journal.close()
            self._release()
            return f"the journal could not be restored: {exc}"
        left = self._serve(server, watch, on_bound=lambda: self._served(taken_at, epoch))
        if left is None:
            self._release()
        return left

    def _served(self, taken_at: float, epoch: int) -> None:
        """Bound: record when (the failover's duration, for everyone's monitor)."""
        log.info(
            "broker %s is active (epoch %d), serving %.3f s after taking the lease",
            self.name,
            epoch,
            time.monotonic() - taken_at,
        )
        try:  # the failover's duration: from the last holder's expiry (PostgreSQL's clock)
            self.lease.mark_serving()
        except JournalError as exc:  # only the figure is lost; the lease is ours
            log.warning("could not record the failover's duration: %s", exc)

    # ---- one server ------------------------------------------------------------------

    def _serve(self, server: BrokerServer, watch: LeaseWatch, on_bound: Any = None) -> str | None:
        """Bind ``server``, run it with this process's signals, close it: the reason
        it left its loop (None: stopped)."""
        self.current = server
        try:
            try:
                server.bind()
            except Exception:
                if isinstance(watch, ActiveWatch):
                    self._release()
                raise
            server.install_signal_handlers(self._on_signal)
            for _ in range(self.stop_requests):  # a signal between two servers
                server.request_shutdown()
            if on_bound is not None:
                on_bound()
            left = server.run()
        except BaseException:
            self.current = None
            server.close()
            raise
        self.current = None
        server.close(linger=STEP_DOWN_LINGER_MS if isinstance(watch, ActiveWatch) and left else 0)
        return left

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stop_requests += 1
        if self.current is not None:
            self.current.request_shutdown()

    def _release(self) -> None:
        """Give the lease up now, so that a standby takes over without waiting for
        it to expire."""
        try:
            self.lease.release()
            log.info("broker %s released the lease", self.name)
        except JournalError as exc:
            log.warning("could not release the lease (it expires by itself): %s", exc)


class _Renewing:
    """Renew the lease from a thread while the loop cannot: restoring a large
    journal may take longer than the TTL, and a lease lost meanwhile would send the
    broker back to standby as soon as it served. Renewal failures are left to the
    loop's first renewal (right after binding) to find."""

    def __init__(self, lease: Lease, interval: float) -> None:
        self.lease = lease
        self.interval = interval
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="emq-lease-restore", daemon=True)

    def __enter__(self) -> _Renewing:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join()

    def _run(self) -> None:
        while not self.done.wait(self.interval):
            try:
                if not self.lease.renew():
                    return
            except JournalError:
                continue
