"""The broker's ports: one module per protocol, each a codec plus an adapter
between its wire and the core (see docs/architecture.md).

``PORTS`` is the configuration: the setting that holds each port's bind address
(an empty one turns the port off) and the class that speaks its protocol. Adding
a protocol is one module here and one line in ``PORTS``.
"""

from __future__ import annotations

from emq_django.broker.ports.base import Port
from emq_django.broker.ports.emqp_clients import EmqpClientPort
from emq_django.broker.ports.emqp_workers import EmqpWorkerPort
from emq_django.broker.ports.eventbus import EventBusPort
from emq_django.broker.ports.mc0 import Mc0Port
from emq_django.broker.ports.mdp import MajordomoPort
from emq_django.broker.ports.monitor import MonitorPort
from emq_django.broker.ports.pzq import PzqPort

# (setting with the bind address, port class); workers first: their replies give
# credit back, so the server reads them before new jobs
PORTS: tuple[tuple[str, type[Port]], ...] = (
    ("BACKEND_BIND", EmqpWorkerPort),
    ("MDP_BIND", MajordomoPort),
    ("PZQ_RECEIVE_BIND", PzqPort),
    ("BUS_SNAPSHOT_BIND", EventBusPort),
    ("FRONTEND_BIND", EmqpClientPort),
    ("MONITOR_BIND", MonitorPort),
    ("MC0_BIND", Mc0Port),
)

__all__ = [
    "PORTS",
    "EmqpClientPort",
    "EmqpWorkerPort",
    "EventBusPort",
    "MajordomoPort",
    "Mc0Port",
    "MonitorPort",
    "Port",
    "PzqPort",
]
