"""Plain text only on loopback: which bind addresses reach other machines.

Without CURVE every job's arguments and results cross the wire as they are. On
a loopback address (or ``ipc://``, ``inproc://``) only this machine can listen;
anywhere else, anyone on the path can. So the broker refuses to bind a
non-loopback address unless CURVE is on (it has ``EMQ_CURVE_SECRET_KEY``) or
``EMQ_ALLOW_PLAINTEXT=true`` says plain text is meant. ``manage.py check``
warns about the same addresses (``emq.W002``).

An address is judged the way libzmq resolves a bind address: ``*`` is every
interface; an IP literal is itself; a network interface's name is that
interface; anything else is a host name, resolved. Whatever cannot be shown to
be loopback counts as exposed.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from emq_django.conf import EmqSettings

LOCAL_TRANSPORTS = ("ipc", "inproc")
HOST_TRANSPORTS = ("tcp", "ws", "wss")  # host:port addresses that may be loopback
IFF_LOOPBACK = 0x8  # <linux/if.h>


def curve_enabled(settings: EmqSettings) -> bool:
    """Whether the broker has its CURVE secret key (``EMQ_CURVE_SECRET_KEY``)."""
    return bool(settings.CURVE_SECRET_KEY.strip())


def split_host(address: str) -> tuple[str, str]:
    """``(transport, host)`` of a ZeroMQ address; host is ``''`` for ipc/inproc.

    ``tcp://[::1]:5555`` gives ``('tcp', '::1')``; ``ws://h:80/path`` ``('ws', 'h')``.
    """
    transport, sep, rest = address.partition("://")
    if not sep:
        raise ImproperlyConfigured(f"{address!r} is not a ZeroMQ address such as tcp://...")
    transport = transport.lower()
    if transport in LOCAL_TRANSPORTS:
        return transport, ""
    rest = rest.split("/", 1)[0]
    if rest.startswith("["):
        host = rest[1:].split("]", 1)[0]
    else:
        host = rest.rsplit(":", 1)[0] if ":" in rest else rest
    return transport, host.split("%", 1)[0]  # fe80::1%eth0: the scope is no part of it


def is_local(address: str) -> bool:
    """Whether only this machine can reach a socket bound at ``address``."""
    transport, host = split_host(address)
    if transport in LOCAL_TRANSPORTS:
        return True
    if transport not in HOST_TRANSPORTS or host in ("", "*"):
        return False  # pgm, udp, norm, ...: multicast or datagrams on the network
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    if host in _interface_names():
        return _interface_is_loopback(host)
    return _resolves_to_loopback(host)


def _interface_names() -> set[str]:
    try:
        return {name for _, name in socket.if_nameindex()}
    except OSError:
        return set()


def _interface_is_loopback(name: str) -> bool:
    try:
        flags = int((Path("/sys/class/net") / name / "flags").read_text().strip(), 16)
    except (OSError, ValueError):
        return name in ("lo", "lo0")
    return bool(flags & IFF_LOOPBACK)


def _resolves_to_loopback(host: str) -> bool:
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return False
    addresses = {info[4][0] for info in infos}
    return bool(addresses) and all(
        ipaddress.ip_address(str(a).split("%", 1)[0]).is_loopback for a in addresses
    )


def settings_binds(settings: EmqSettings) -> list[tuple[str, str]]:
    """``(setting name, address)`` of every address the broker would bind: each
    ``EMQ_*_BIND`` setting (so a new port's is included), less the empty ones
    (a port turned off) and PZQ's other two when PZQ is off."""
    binds = []
    for f in fields(settings):
        address = getattr(settings, f.name)
        if not f.name.endswith("_BIND") or not address:
            continue
        if f.name.startswith("PZQ_") and not settings.PZQ_RECEIVE_BIND:
            continue
        binds.append((f"EMQ_{f.name}", address))
    return binds


def exposed(binds: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The ``(label, address)`` pairs other machines could reach."""
    return [(label, address) for label, address in binds if not is_local(address)]


def plaintext_exposed(
    settings: EmqSettings, binds: Iterable[tuple[str, str]]
) -> list[tuple[str, str]]:
    """The binds that would carry plain text to other machines: none when CURVE is
    on or ``EMQ_ALLOW_PLAINTEXT`` is set."""
    if settings.ALLOW_PLAINTEXT or curve_enabled(settings):
        return []
    return exposed(binds)


def explain(bad: list[tuple[str, str]]) -> str:
    where = ", ".join(f"{label} {address}" for label, address in bad)
    return (
        f"refusing to bind a non-loopback address without CURVE: {where}. "
        "Without CURVE, jobs, arguments and results cross the network in plain text. "
        "Set EMQ_CURVE_SECRET_KEY (manage.py emq_keys generate) to encrypt, bind a "
        "loopback address (tcp://127.0.0.1:...) or ipc://, or set "
        "EMQ_ALLOW_PLAINTEXT=true to accept plain text on purpose"
    )


def require_safe_binds(settings: EmqSettings, binds: Iterable[tuple[str, str]]) -> None:
    """Raises ``ImproperlyConfigured`` naming each bind that would expose plain text."""
    bad = plaintext_exposed(settings, binds)
    if bad:
        raise ImproperlyConfigured(explain(bad))
