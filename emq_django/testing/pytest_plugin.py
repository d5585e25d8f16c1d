"""The ``emq_broker`` pytest fixture (registered with pytest by the
``pytest11`` entry point in emq-django's metadata)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from emq_django.testing.broker import InMemoryBroker


@pytest.fixture
def emq_broker() -> Iterator[InMemoryBroker]:
    """An in-memory broker installed for this test: ``task.delay(...)`` sends to
    it, ``.get()`` runs the job here, ``emq_broker.advance(seconds)`` moves its
    clock. Django must be set up (pytest-django does it)."""
    from emq_django.testing.broker import InMemoryBroker

    with InMemoryBroker() as broker:
        yield broker
