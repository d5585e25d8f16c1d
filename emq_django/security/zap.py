"""The broker's ZAP handler (ZeroMQ RFC 27) on ``inproc://zeromq.zap.01``.

libzmq asks it about every CURVE handshake on the broker's sockets. It admits a
client key when the allow-list has it enabled with one of the roles in the
socket's ZAP domain (``security/roles.py``), and answers with the key's name as
the User-Id, which every message from that connection then carries. Unknown,
disabled and wrong-role keys are refused, counted (``zap_refused_*``) and logged
with the key (Z85), within a log budget.

It runs in its own thread on the broker's context: the handshake of a new
connection waits for it, never the server loop.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import zmq
import zmq.utils.z85

from emq_django.security.allow import AllowList
from emq_django.security.roles import domain_roles
from emq_django.security.service import SocketThread

log = logging.getLogger(__name__)

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_VERSION = b"1.0"
LOG_BUDGET = 200  # refusals logged, then every 1,000th
COUNTERS = (
    "zap_admitted",
    "zap_refused_unknown",  # a key not in the allow-list
    "zap_refused_revoked",  # a disabled key
    "zap_refused_role",  # a key without a role the port admits
    "zap_refused_mechanism",  # not CURVE (plain text never reaches ZAP: libzmq refuses it)
    "zap_malformed",
    "zap_errors",
)


def _error_reply(request: list[bytes]) -> list[bytes] | None:
    """A 500 for ``request``, if it has the frames a reply needs."""
    if b"" not in request:
        return None
    d = request.index(b"")
    request_id = request[d + 2] if len(request) > d + 2 else b""
    return [*request[: d + 1], ZAP_VERSION, request_id, b"500", b"internal error", b"", b""]


class ZapHandler(SocketThread):
    thread_name = "emq-zap"

    def __init__(self, context: zmq.Context[Any], allow: AllowList) -> None:
        super().__init__(context)
        self.allow = allow
        self.counters: Counter[str] = Counter(dict.fromkeys(COUNTERS, 0))
        self._log_budget = LOG_BUDGET

    def start(self) -> None:
        """Bind (here, so that an error shows in the caller) and serve in a thread.
        Raises ``zmq.ZMQError`` if another handler holds the ZAP endpoint."""
        sock = self.context.socket(zmq.ROUTER)
        sock.linger = 0
        try:
            sock.bind(ZAP_ENDPOINT)
        except zmq.ZMQError:
            sock.close()
            raise
        self._start([sock])

    def _on_readable(self, sock: zmq.Socket[Any]) -> None:
        request = sock.recv_multipart()
        try:
            reply = self.answer(request)
        except Exception:  # a bug must not stop the handler: refuse this one
            log.exception("ZAP handler error; refusing the connection")
            self.counters["zap_errors"] += 1
            reply = _error_reply(request)
        if reply is not None:
            sock.send_multipart(reply)

    def answer(self, request: list[bytes]) -> list[bytes] | None:
        """The reply to one ZAP request (``[routing id, b"", version, request id,
        domain, address, identity, mechanism, *credentials]``)."""
        try:
            delimiter = request.index(b"")
        except ValueError:
            return None
        envelope, body = request[: delimiter + 1], request[delimiter + 1 :]
        if len(body) < 6 or body[0] != ZAP_VERSION:
            self.counters["zap_malformed"] += 1
            request_id = body[1] if len(body) > 1 else b""
            return [*envelope, ZAP_VERSION, request_id, b"400", b"bad ZAP request", b"", b""]
        request_id, domain, address, mechanism = body[1], body[2], body[3], body[5]
        credentials = body[6:]
        code, text, user = self.decide(domain.decode(), mechanism, credentials, address)
        return [*envelope, ZAP_VERSION, request_id, code, text, user.encode(), b""]

    def decide(
        self, domain: str, mechanism: bytes, credentials: list[bytes], address: bytes
    ) -> tuple[bytes, bytes, str]:
        """(status code, status text, user id) for one handshake."""
        if mechanism != b"CURVE" or not credentials or len(credentials[0]) != 32:
            return self._refuse("mechanism", f"a {mechanism.decode()} connection", domain, address)
        key = zmq.utils.z85.encode(credentials[0]).decode()
        entry = self.allow.entry(key)
        if entry is None:
            return self._refuse("unknown", f"unknown key {key}", domain, address)
        if not entry.enabled:
            return self._refuse("revoked", f"revoked key {key} ({entry.name})", domain, address)
        admitted = domain_roles(domain)
        if admitted is not None and not entry.roles & admitted:
            what = f"key {key} ({entry.name}, roles {','.join(sorted(entry.roles)) or 'none'})"
            return self._refuse("role", what, domain, address)
        self.counters["zap_admitted"] += 1
        self.allow.seen.add(entry.name)
        return b"200", b"OK", entry.name

    def _refuse(self, why: str, what: str, domain: str, address: bytes) -> tuple[bytes, bytes, str]:
        self.counters[f"zap_refused_{why}"] += 1
        n = sum(v for k, v in self.counters.items() if k.startswith("zap_refused"))
        if self._log_budget > 0 or n % 1000 == 0:
            self._log_budget -= 1
            log.warning(
                "refused %s from %s on the port for %s (%d refused so far)",
                what,
                address.decode(errors="replace") or "?",
                domain,
                n,
            )
        return b"400", f"refused: {why}".encode(), ""
