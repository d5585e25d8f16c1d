"""The seams that keep the core's modules below the ports and the server below the
Django apps (tests/unit/test_import_graph.py checks the imports themselves)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import zmq
from django.core.exceptions import ImproperlyConfigured

from emq_django.broker.ports import PORTS
from emq_django.broker.ports.base import Port
from emq_django.broker.server import BrokerServer
from tests.support import private_broker_settings


def test_a_port_says_whether_it_has_a_per_command_rule() -> None:
    """The guard calls ``authorize`` only for a port class that overrides it."""
    classes = {cls for _, cls in PORTS}
    assert {cls.__name__ for cls in classes if cls.authorizes} >= {"MonitorPort", "MajordomoPort"}
    for cls in classes:
        assert cls.authorizes == (cls.authorize is not Port.authorize), cls


def test_a_curve_broker_given_no_key_loader_refuses_to_start_saying_what_to_pass(
    tmp_path: Path,
) -> None:
    settings = dataclasses.replace(
        private_broker_settings(tmp_path), CURVE_SECRET_KEY=zmq.curve_keypair()[1].decode()
    )
    context: zmq.Context[Any] = zmq.Context()
    try:
        with pytest.raises(ImproperlyConfigured, match="load_keys"):
            BrokerServer(settings, context=context)
    finally:
        context.destroy(linger=0)
