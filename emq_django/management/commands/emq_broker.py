"""``manage.py emq_broker``: run the broker."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import zmq
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from emq_django.broker.journal import JournalError
from emq_django.broker.memory import allocator_reexec
from emq_django.conf import get_settings
from emq_django.logconfig import configure_command_logging


class Command(BaseCommand):
    help = "Run the emq broker (eMQP/1.0 over ZeroMQ)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--frontend",
            help="bind address for clients and schedulers "
            "(default EMQ_FRONTEND_BIND, tcp://127.0.0.1:47291)",
        )
        parser.add_argument(
            "--backend",
            help="bind address for job managers (default EMQ_BACKEND_BIND, tcp://127.0.0.1:47290)",
        )
        parser.add_argument(
            "--monitor",
            help="bind address of the monitor channel "
            "(default EMQ_MONITOR_BIND, tcp://127.0.0.1:47293)",
        )
        parser.add_argument("--heartbeat-interval", type=float)
        parser.add_argument(
            "--heartbeat-liveness", type=int, help="missed heartbeats before a peer is dropped"
        )
        parser.add_argument("--max-pending", type=int, help="waiting jobs allowed per queue")
        parser.add_argument(
            "--new-journal",
            action="store_true",
            help="start with an empty journal on purpose (an existing file is moved aside); "
            "without it an empty or unreadable journal file stops the broker",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        from emq_django.broker.server import BrokerServer
        from emq_django.security.store import load_authorized_keys, save_last_seen

        configure_command_logging(opts["verbosity"], get_settings().LOG_FORMAT)
        settings = get_settings(
            frontend_bind=opts["frontend"],
            backend_bind=opts["backend"],
            monitor_bind=opts["monitor"],
            heartbeat_interval=opts["heartbeat_interval"],
            heartbeat_liveness=opts["heartbeat_liveness"],
            max_pending=opts["max_pending"],
        )
        if getattr(self, "_called_from_command_line", False):  # not call_command()
            self._reexec_with_allocator(settings.BROKER_PYTHONMALLOC)
        if settings.JOURNAL_URL:
            self._run_with_lease(settings, opts["new_journal"])
            return
        try:
            server = BrokerServer(
                settings,
                new_journal=opts["new_journal"],
                load_keys=load_authorized_keys,
                save_seen=save_last_seen,
            )
        except JournalError as exc:
            raise CommandError(str(exc)) from exc
        try:
            server.bind()
        except ImproperlyConfigured as exc:
            server.close()
            raise CommandError(str(exc)) from exc
        except zmq.ZMQError as exc:
            server.close()
            raise CommandError(f"{exc}; is another broker running?") from exc
        server.install_signal_handlers()
        server.tune_gc()  # gc.freeze() of what start-up made, and a larger young generation
        try:
            server.run()
        finally:
            server.close()

    def _run_with_lease(self, settings: Any, new_journal: bool) -> None:
        """The journal in PostgreSQL: active or standby under its lease (``broker/ha.py``)."""
        from emq_django.broker.ha import HaBroker
        from emq_django.broker.memory import tune_gc
        from emq_django.security.store import load_authorized_keys, save_last_seen

        if new_journal:
            raise CommandError(
                "--new-journal does not apply to the PostgreSQL journal (EMQ_JOURNAL_URL): "
                "a standby taking over must restore what the active broker wrote"
            )
        try:
            broker = HaBroker(settings, load_keys=load_authorized_keys, save_seen=save_last_seen)
        except JournalError as exc:
            raise CommandError(str(exc)) from exc
        tune_gc()
        try:
            broker.run()
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        except zmq.ZMQError as exc:
            raise CommandError(f"{exc}; is another broker running on this address?") from exc

    def _reexec_with_allocator(self, wanted: str) -> None:
        """Replace this process (same PID) by the same command under
        ``PYTHONMALLOC=wanted`` (EMQ_BROKER_PYTHONMALLOC), before anything is bound:
        see ``emq_django.broker.memory``. Nothing happens when it is set already."""
        plan = allocator_reexec(wanted, os.environ)
        if plan is None:
            return
        argv, env = plan
        logging.getLogger("emq_django.broker.server").info(
            "re-executing with PYTHONMALLOC=%s (EMQ_BROKER_PYTHONMALLOC): glibc's malloc "
            "gives a drained backlog's memory back",
            wanted,
        )
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(argv[0], argv, env)
