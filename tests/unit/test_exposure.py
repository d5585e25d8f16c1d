"""Plain text only on loopback (emq_django/broker/exposure.py): which bind addresses
reach other machines, and when the broker refuses them."""

from __future__ import annotations

import socket

import pytest
import zmq
from django.core.exceptions import ImproperlyConfigured

from emq_django.broker import exposure
from emq_django.broker.server import BrokerServer
from emq_django.conf import get_settings
from tests.support import free_tcp_port


@pytest.mark.parametrize(
    "address",
    [
        "tcp://127.0.0.1:47291",
        "tcp://127.0.0.2:5555",
        "tcp://[::1]:5555",
        "tcp://localhost:5555",
        "tcp://lo:5555",
        "tcp://127.0.0.1:*",
        "ipc:///tmp/emq.sock",
        "inproc://broker",
        "ws://127.0.0.1:8080/emq",
    ],
)
def test_loopback_and_local_transports_are_local(address: str) -> None:
    assert exposure.is_local(address)


@pytest.mark.parametrize(
    "address",
    [
        "tcp://0.0.0.0:47291",
        "tcp://*:47291",
        "tcp://[::]:47291",
        "tcp://192.0.2.2:47291",
        "tcp://[fd00::2]:47291",
        "tcp://[fe80::1%eth0]:47291",
        "tcp://no-such-host.invalid:47291",
        "ws://0.0.0.0:8080/emq",
        "pgm://eth0;239.192.1.1:5555",
        "udp://127.0.0.1:5555",  # a datagram transport: not judged by its host
    ],
)
def test_every_interface_other_addresses_and_unknown_hosts_are_exposed(address: str) -> None:
    assert not exposure.is_local(address)


def test_a_network_interface_name_is_judged_by_its_loopback_flag() -> None:
    names = {name for _, name in socket.if_nameindex()}
    others = sorted(n for n in names if not exposure._interface_is_loopback(n))
    if not others:
        pytest.skip("this machine has no network interface but loopback")
    assert not exposure.is_local(f"tcp://{others[0]}:5555")


def test_split_host_reads_ipv6_brackets_paths_and_scopes() -> None:
    assert exposure.split_host("tcp://[::1]:5555") == ("tcp", "::1")
    assert exposure.split_host("ws://example.org:80/a/b") == ("ws", "example.org")
    assert exposure.split_host("tcp://[fe80::1%eth0]:1") == ("tcp", "fe80::1")
    assert exposure.split_host("IPC:///x") == ("ipc", "")
    with pytest.raises(ImproperlyConfigured):
        exposure.split_host("127.0.0.1:5555")


def test_settings_binds_leave_out_turned_off_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMQ_MDP_BIND", "")
    monkeypatch.setenv("EMQ_PZQ_RECEIVE_BIND", "")
    for name in ("SNAPSHOT", "PUBLISH", "COLLECT"):
        monkeypatch.setenv(f"EMQ_BUS_{name}_BIND", "")
    monkeypatch.setenv("EMQ_MC0_BIND", "")
    names = [name for name, _ in exposure.settings_binds(get_settings())]
    assert names == ["EMQ_FRONTEND_BIND", "EMQ_BACKEND_BIND", "EMQ_MONITOR_BIND"]


def _exposed_settings(monkeypatch: pytest.MonkeyPatch, **env: str) -> None:
    monkeypatch.setenv("EMQ_FRONTEND_BIND", f"tcp://0.0.0.0:{free_tcp_port()}")
    monkeypatch.delenv("EMQ_CURVE_SECRET_KEY", raising=False)
    monkeypatch.delenv("EMQ_ALLOW_PLAINTEXT", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def test_the_server_refuses_a_plaintext_non_loopback_bind_before_binding_any(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _exposed_settings(monkeypatch)
    settings = get_settings()
    context: zmq.Context[object] = zmq.Context()
    server = BrokerServer(settings, context=context)
    try:
        with pytest.raises(ImproperlyConfigured) as caught:
            server.bind()
        message = str(caught.value)
        assert f"frontend {settings.FRONTEND_BIND}" in message
        assert "EMQ_ALLOW_PLAINTEXT=true" in message and "EMQ_CURVE_SECRET_KEY" in message
        assert "backend" not in message  # loopback ones are not named
        # nothing was bound: the loopback backend port is still free
        probe = socket.socket()
        try:
            probe.bind(("127.0.0.1", int(settings.BACKEND_BIND.rsplit(":", 1)[1])))
        finally:
            probe.close()
    finally:
        server.close()
        context.destroy(linger=0)


@pytest.mark.parametrize(
    "env",
    [{"EMQ_ALLOW_PLAINTEXT": "true"}, {"EMQ_CURVE_SECRET_KEY": zmq.curve_keypair()[1].decode()}],
)
def test_allow_plaintext_or_a_curve_key_lifts_the_refusal(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    _exposed_settings(monkeypatch, **env)
    settings = get_settings()
    binds = exposure.settings_binds(settings)
    assert exposure.exposed(binds)  # still a non-loopback address
    assert exposure.plaintext_exposed(settings, binds) == []
    exposure.require_safe_binds(settings, binds)


def test_the_system_check_judges_every_address_the_server_binds() -> None:
    """``manage.py check`` reads the settings, the server its sockets: the same set."""
    settings = get_settings()
    context: zmq.Context[object] = zmq.Context()
    server = BrokerServer(settings, context=context)
    try:
        bound = {spec.address for _, spec, _, _, _ in server.endpoints}
    finally:
        server.close()
        context.destroy(linger=0)
    assert {address for _, address in exposure.settings_binds(settings)} == bound
