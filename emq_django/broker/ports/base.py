"""What every port is: a codec and an adapter between one wire and the core.

A port decodes the messages its socket receives (``handle``) into calls on
``BrokerCore``, and encodes the core's effects for its wire (``encode``). It
touches no socket: the server owns them, binds one per port with the options
``socket_options`` gives, and sends what ``encode`` returns to the effect's
identity on that port's socket.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING

from emq_django.broker.effects import Effect
from emq_django.broker.state import show_identity
from emq_django.exceptions import ProtocolError
from emq_django.transport import SocketOptions

if TYPE_CHECKING:
    from emq_django.broker.core import BrokerCore

log = logging.getLogger(__name__)

ERROR_LOG_BUDGET = 100  # malformed messages logged per port, then every 10,000th


class Port(ABC):
    """One protocol on one socket. ``name`` shows in logs and counters."""

    name = "port"
    # its clients get partial results whatever their request said (Majordomo)
    always_streams = False

    def __init__(self, core: BrokerCore, address: str = "") -> None:
        self.core = core
        self.address = address
        self._error_log_budget = ERROR_LOG_BUDGET

    def socket_options(self) -> SocketOptions:
        """ROUTER_MANDATORY: an unroutable peer raises instead of a silent drop."""
        return SocketOptions(router_mandatory=True)

    @abstractmethod
    def handle(self, identity: bytes, frames: Sequence[bytes], now: float) -> list[bytes] | None:
        """One message from ``identity``; returns frames to send straight back to it
        (a request-reply protocol's answer), or None."""

    @abstractmethod
    def encode(self, effect: Effect) -> list[bytes] | None:
        """The frames that carry ``effect`` on this wire (without the identity), or
        None when the effect means nothing here."""

    def unroutable(self, identity: bytes, now: float) -> None:
        """The socket could not route to ``identity``: that peer is gone."""
        self.core.counters["unroutable"] += 1

    def count_malformed(self, identity: bytes, exc: ProtocolError, answered: bool) -> None:
        """Count (and, within a budget, log) a message ``decode`` refused."""
        counters = self.core.counters
        counters["protocol_errors"] += 1
        if not answered:
            counters["dropped_malformed"] += 1
        n = counters["protocol_errors"]
        if self._error_log_budget > 0 or n % 10_000 == 0:
            self._error_log_budget -= 1
            log.warning(
                "%s a malformed message on the %s port from %s: %s (%d so far)",
                "refused" if answered else "dropped",
                self.name,
                show_identity(identity),
                exc,
                n,
            )
