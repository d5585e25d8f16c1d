"""``InMemoryBrokerMixin``: an in-memory broker for each test of a Django
``TestCase`` (or ``SimpleTestCase``) class."""

from __future__ import annotations

from typing import Any

from emq_django.testing.broker import InMemoryBroker


class InMemoryBrokerMixin:
    """Put before ``TestCase`` in the bases: every test gets ``self.emq_broker``,
    installed for that test alone. ``emq_broker_config``: a ``BrokerConfig`` for
    the core's bounds (default: from the ``EMQ_*`` settings)."""

    emq_broker_config: Any = None
    emq_broker: InMemoryBroker

    def setUp(self) -> None:
        super().setUp()  # type: ignore[misc]
        self.emq_broker = InMemoryBroker(self.emq_broker_config).install()
        self.addCleanup(self.emq_broker.uninstall)  # type: ignore[attr-defined]
