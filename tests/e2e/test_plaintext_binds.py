"""The real ``manage.py emq_broker``: plain text only on loopback. A non-loopback
bind without CURVE stops it with a clear error; ``EMQ_ALLOW_PLAINTEXT=true`` lets it
start (broker/exposure.py)."""

from __future__ import annotations

import pytest

from emq_django.client import Client
from emq_django.protocol.headers import format_headers
from tests.support import EmqProcesses, free_tcp_ports

pytestmark = pytest.mark.e2e


def _exposed_env(allow: bool) -> dict[str, str]:
    frontend, backend = free_tcp_ports(2)
    env = {
        "EMQ_FRONTEND_BIND": f"tcp://0.0.0.0:{frontend}",
        "EMQ_BROKER_URL": f"tcp://127.0.0.1:{frontend}",
        "EMQ_BACKEND_BIND": f"tcp://*:{backend}",
        "EMQ_CURVE_SECRET_KEY": "",
    }
    if allow:
        env["EMQ_ALLOW_PLAINTEXT"] = "true"
    return env


def test_a_plaintext_bind_on_every_interface_stops_the_broker(
    emq_processes: EmqProcesses,
) -> None:
    env = _exposed_env(allow=False)
    broker = emq_processes.start("emq_broker", env=env)
    assert emq_processes.wait_for_exit(broker, timeout=30) != 0
    err = broker.stderr()
    assert "refusing to bind a non-loopback address without CURVE" in err
    assert env["EMQ_FRONTEND_BIND"] in err and env["EMQ_BACKEND_BIND"] in err
    assert "EMQ_ALLOW_PLAINTEXT=true" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("value", ["true", "1"])
def test_allow_plaintext_lets_the_broker_bind_every_interface(
    emq_processes: EmqProcesses, value: str
) -> None:
    env = _exposed_env(allow=True)
    env["EMQ_ALLOW_PLAINTEXT"] = value
    broker = emq_processes.start("emq_broker", env=env)
    port = int(env["EMQ_FRONTEND_BIND"].rsplit(":", 1)[1])
    emq_processes.wait_for_port(port, proc=broker, timeout=30)
    client = Client(env["EMQ_BROKER_URL"], ack_timeout=10)
    try:
        headers = format_headers(guarantee=False, reply_requested=False)
        assert client.send("default", headers, b"[]", confirm=True)
    finally:
        client.close()
    assert broker.alive()
