"""The eMQP ports' straight-through paths (a 7-frame REQUEST; a REPLY or READY from
a known peer) answer exactly as the general decoder does, at their edges."""

from __future__ import annotations

import pytest

from emq_django.broker.core import BrokerConfig
from emq_django.exceptions import ProtocolError
from emq_django.protocol import PROTOCOL, Error, decode
from emq_django.protocol import frames as F
from tests.emqp_machine import FRONTEND, EmqpMachine

P = PROTOCOL
BODY = b'["run", {"callable": "add", "path": "pkg.tasks", "args": [1, 2], "kwargs": {}}]'


def machine() -> EmqpMachine:
    core = EmqpMachine(BrokerConfig(1.0, 3), now=0.0)
    core.on_backend(b"w", [b"", P, b"INFORM", b"i", b'[[10, "q"]]', b"worker"], 0.0)
    core.out.clear()
    return core


def errors(core: EmqpMachine) -> list[tuple[int, str]]:
    out, core.out = core.out, []
    return [(s, cmd.code) for s, _, f in out if isinstance(cmd := decode(f), Error)]


def test_request_fields_agree_with_decode() -> None:
    frames = [b"", P, b"REQUEST", b"m", b"q", b"reply-requested,task:t", BODY]
    queue, headers = F.request_fields(frames) or ("", None)
    cmd = decode(frames)
    assert (queue, headers) == (cmd.queue, cmd.headers)  # type: ignore[union-attr]
    assert F.request_fields([b"", P, b"PUBLISH", b"m", b"q", b"", BODY]) is None
    assert F.request_fields([b"", P, b"REQUEST", b"", b"q", b"", BODY]) is None
    assert F.request_fields([b"x", P, b"REQUEST", b"m", b"q", b"", BODY]) is None
    for bad in (b"", b"\xff", b"q" * 300):
        with pytest.raises(ProtocolError):
            F.request_fields([b"", P, b"REQUEST", b"m", bad, b"", BODY])


@pytest.mark.parametrize(
    ("frames", "code"),
    [
        ([b"", P, b"REQUEST", b"m", b"", b"", BODY], "bad-queue-name"),
        ([b"", P, b"REQUEST", b"m", b"q" * 300, b"", BODY], "queue-name-too-long"),
        ([b"", P, b"REQUEST", b"m", b"q", b"timeout:-1", BODY], "bad-header"),
        # a msgid too long to take is named in the ERROR (its sender waits on it) ...
        ([b"", P, b"REQUEST", b"m" * 300, b"q", b"", BODY], "malformed"),
        # ... up to MAX_ANSWERED_ID_LENGTH: past it, no msgid to answer
        ([b"", P, b"REQUEST", b"m" * 5000, b"q", b"", BODY], None),
    ],
)
def test_a_bad_request_is_refused_as_before(frames: list[bytes], code: str | None) -> None:
    core = machine()
    core.on_frontend(b"c", frames, 0.0)
    assert errors(core) == ([] if code is None else [(FRONTEND, code)])
    assert core.counters["protocol_errors"] == 1
    assert not core.inflight


def test_reply_and_ready_edges_take_the_general_path() -> None:
    core = machine()
    core.on_backend(b"w", [b"", P, b"READY", b"r"], 1.0)
    assert core.peers[b"w"].credit == 1 and core.peers[b"w"].last_seen == 1.0
    core.on_frontend(b"c", [b"", P, b"REQUEST", b"j", b"q", b"", BODY], 1.0)
    core.out.clear()
    # a status frame over the limit: malformed, dropped, the job stays in flight
    long_status = [b"", P, b"REPLY", b"x", b"{}", b"j#1", b"ok," + b"x" * 300]
    core.on_backend(b"w", long_status, 2.0)
    assert core.counters["protocol_errors"] == 1 and b"j#1" in core.inflight
    # the same REPLY from a stranger: an unknown peer, a stale reply
    core.on_backend(b"s", [b"", P, b"REPLY", b"x", b"{}", b"j#1", b"ok,ready"], 2.0)
    assert core.counters["unknown_peer"] == 1 and core.counters["stale_replies"] == 1
    core.on_backend(b"w", [b"", P, b"REPLY", b"x", b"{}", b"j#1", b"ok,ready"], 3.0)
    assert not core.inflight and core.counters["succeeded"] == 1
    assert core.peers[b"w"].credit == 1 and errors(core) == []
