"""Test helpers for users' tests: an in-memory broker that runs jobs through the
real broker core and the real worker code in this process, with a clock the test
moves (docs/testing.md).

- ``InMemoryBroker``: ``with InMemoryBroker() as broker: ...``, its bounds
  (``BrokerConfig``) from the ``EMQ_*`` settings unless given;
- the ``emq_broker`` pytest fixture (the ``emq_django.testing.pytest_plugin``
  plugin, which installing emq-django registers with pytest);
- ``InMemoryBrokerMixin`` for Django ``TestCase`` classes (``self.emq_broker``).

``EMQ_EAGER`` stays for the simple case: it runs a task where ``delay()`` is
called, without retries, countdowns, refusals or anything the broker decides.
"""

from emq_django.broker.state import BrokerConfig
from emq_django.testing.broker import InMemoryBroker
from emq_django.testing.django import InMemoryBrokerMixin

__all__ = ["BrokerConfig", "InMemoryBroker", "InMemoryBrokerMixin"]
