"""Every ZeroMQ socket emq opens is made here.

The broker's ports, the client, ``BrokerLink`` (job managers, worker processes,
the scheduler), the monitor client and the job-history forwarder all ask this
module for their sockets, so that a socket option that must hold everywhere
(linger, high-water marks, ROUTER_MANDATORY, CURVE keys and the ZAP domain) is
set in one place and cannot be forgotten by one of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import zmq

from emq_django.security.keys import CurveKeys

Socket = zmq.Socket[Any]
Context = zmq.Context[Any]


@dataclass(frozen=True, slots=True)
class SocketOptions:
    """What a socket needs beyond its kind. ``None`` leaves libzmq's default."""

    linger: int = 0  # ms; 0: a closed socket drops what it had queued
    identity: bytes | None = None
    sndhwm: int | None = None
    rcvhwm: int | None = None
    router_mandatory: bool = False  # EHOSTUNREACH instead of a silent drop
    # CURVE: a server when ``curve.server`` is None, else a client of that server
    curve: CurveKeys | None = None
    # the ZAP domain (a bound socket's roles, security/zap.py); '' leaves it unset
    zap_domain: str = ""
    xpub_verboser: bool = False  # an XPUB passes on every (un)subscription


def make_socket(context: Context, kind: int, options: SocketOptions | None = None) -> Socket:
    """A new socket of ``kind`` (``zmq.DEALER``, ...) with ``options`` applied."""
    opts = options or SocketOptions()
    sock: Socket = context.socket(kind)
    sock.linger = opts.linger
    if opts.identity is not None:
        sock.identity = opts.identity
    if opts.sndhwm is not None:
        sock.sndhwm = opts.sndhwm
    if opts.rcvhwm is not None:
        sock.rcvhwm = opts.rcvhwm
    if opts.router_mandatory:
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    if opts.curve is not None:
        _set_curve(sock, opts.curve)
    if opts.zap_domain:
        sock.zap_domain = opts.zap_domain.encode()
    if opts.xpub_verboser:
        sock.setsockopt(zmq.XPUB_VERBOSER, 1)
    return sock


def _set_curve(sock: Socket, keys: CurveKeys) -> None:
    """Keys go in before bind/connect: libzmq reads them at the handshake."""
    sock.curve_secretkey = keys.secret
    sock.curve_publickey = keys.public
    if keys.server is None:
        sock.curve_server = True
        # no ZAP handler answering (it died, or was never started): refuse every
        # client, where libzmq would otherwise admit any key
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
    else:
        sock.curve_serverkey = keys.server


def connect(context: Context, kind: int, url: str, options: SocketOptions | None = None) -> Socket:
    """A new socket connected to ``url``."""
    sock = make_socket(context, kind, options)
    try:
        sock.connect(url)
    except zmq.ZMQError:
        sock.close(linger=0)
        raise
    return sock


def bind(context: Context, kind: int, address: str, options: SocketOptions | None = None) -> Socket:
    """A new socket bound to ``address``; raises ``zmq.ZMQError`` (e.g. address in use)."""
    sock = make_socket(context, kind, options)
    try:
        sock.bind(address)
    except zmq.ZMQError:
        sock.close(linger=0)
        raise
    return sock
