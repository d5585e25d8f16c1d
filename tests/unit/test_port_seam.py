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


def test_every_effect_the_server_holds_for_a_commit_is_told_to_a_peer_or_not_by_its_type() -> None:
    """``BrokerServer._write_off_loop`` finds the peers of held effects by type
    (``_NO_PEER``), not by ``hasattr``: an effect type added later must have a
    ``peer`` or be named there, or a held commit would fail on it."""
    import dataclasses
    import typing

    from emq_django.broker import effects
    from emq_django.broker.server import _NO_PEER

    for kind in typing.get_args(effects.Effect):
        fields = {f.name for f in dataclasses.fields(kind)}
        assert (kind in _NO_PEER) != ("peer" in fields), kind.__name__
