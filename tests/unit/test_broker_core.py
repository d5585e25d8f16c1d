"""The broker core through its two eMQP ports (tests/emqp_machine.py): eMQP frames in,
frames out through the ports' codec, fake ``now``. What a peer sees on the wire is asserted
here; the core's own job life is asserted on typed effects in test_lifecycle.py and
test_held_attempts.py (tests/support/core_harness.py)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from emq_django.broker import monitor
from emq_django.broker.core import COUNTERS, BrokerConfig
from emq_django.protocol import (
    PROTOCOL,
    Ack,
    Error,
    Heartbeat,
    Kbye,
    Reply,
    Request,
    decode,
    parse_headers,
)
from tests.emqp_machine import BACKEND, FRONTEND, EmqpMachine

P = PROTOCOL
BODY = b'["run", {"callable": "add", "path": "pkg.tasks", "args": [1, 2], "kwargs": {}}]'
INTERVAL = 1.0
LIVENESS = 3

Out = list[tuple[int, bytes, list[bytes]]]


def make_core(max_pending: int = 100_000) -> EmqpMachine:
    return EmqpMachine(BrokerConfig(INTERVAL, LIVENESS, max_pending), now=0.0, id_prefix=b"b-")


def take(core: EmqpMachine) -> Out:
    out, core.out = core.out, []
    return out


def sent_to(out: Out, socket: int, identity: bytes) -> list[Any]:
    return [decode(frames) for s, i, frames in out if s == socket and i == identity]


def requests_to(out: Out, identity: bytes) -> list[Request]:
    return [c for c in sent_to(out, BACKEND, identity) if isinstance(c, Request)]


def inform(
    core: EmqpMachine,
    ident: bytes,
    queues: bytes = b'[[10, "default"]]',
    meta: dict[str, Any] | None = None,
    now: float = 0.0,
) -> Out:
    frames = [b"", P, b"INFORM", ident + b"-inform", queues, b"worker"]
    if meta:
        frames.append(json.dumps(meta).encode())
    core.on_backend(ident, frames, now)
    return take(core)


def ready(core: EmqpMachine, ident: bytes, now: float = 0.0, times: int = 1) -> Out:
    for n in range(times):
        core.on_backend(ident, [b"", P, b"READY", ident + b"-ready-%d" % n], now)
    return take(core)


def request(
    core: EmqpMachine,
    client: bytes,
    msgid: bytes,
    queue: bytes = b"default",
    headers: bytes = b"",
    now: float = 0.0,
) -> Out:
    core.on_frontend(client, [b"", P, b"REQUEST", msgid, queue, headers, BODY], now)
    return take(core)


def reply(
    core: EmqpMachine,
    ident: bytes,
    attempt_id: bytes,
    status: bytes | None = b"ok,ready",
    body: bytes = b'{"value": 3}',
    now: float = 0.0,
) -> Out:
    frames = [b"", P, b"REPLY", ident + b"-reply", body, attempt_id]
    if status is not None:
        frames.append(status)
    core.on_backend(ident, frames, now)
    return take(core)


def heartbeat(core: EmqpMachine, ident: bytes, now: float) -> None:
    core.on_backend(ident, [b"", P, b"HEARTBEAT", ident + b"-hb", b"%f" % now], now)


def tick(core: EmqpMachine, now: float, keep_alive: tuple[bytes, ...] = ()) -> Out:
    for ident in keep_alive:
        heartbeat(core, ident, now)
    core.on_timer(now)
    return take(core)


def is_ack_of(cmd: object, msgid: bytes) -> bool:
    return isinstance(cmd, Ack) and cmd.ack_msgid == msgid


# ---- ACK -------------------------------------------------------------------


def test_request_is_acked_to_the_client() -> None:
    core = make_core()
    out = request(core, b"client", b"c1")
    assert [is_ack_of(c, b"c1") for c in sent_to(out, FRONTEND, b"client")] == [True]
    assert core.counters["acked"] == 1 and core.counters["received"] == 1


def test_worker_inform_is_acked_on_the_backend() -> None:
    core = make_core()
    out = inform(core, b"w1")
    cmds = sent_to(out, BACKEND, b"w1")
    assert is_ack_of(cmds[0], b"w1-inform")
    assert any(isinstance(c, Heartbeat) for c in cmds)  # EventMQ starts workers on it


def test_scheduler_inform_is_acked_on_the_frontend() -> None:
    core = make_core()
    core.on_frontend(b"sched", [b"", P, b"INFORM", b"s-inform", b"", b"scheduler"], 0.0)
    cmds = sent_to(take(core), FRONTEND, b"sched")
    assert is_ack_of(cmds[0], b"s-inform")
    assert b"sched" in core.schedulers


@pytest.mark.parametrize(
    "frames",
    [
        pytest.param(
            [b"", P, b"SCHEDULE", b"x1", b"default", b"guarantee", b"60", BODY, b""],
            id="schedule-9",
        ),
        pytest.param([b"", P, b"SCHEDULE", b"x1", b"default", b"guarantee", BODY], id="schedule-7"),
        pytest.param(
            [b"", P, b"UNSCHEDULE", b"x1", b"default", b"guarantee", b"-1", BODY, b""],
            id="unschedule",
        ),
        pytest.param([b"", P, b"PUBLISH", b"x1", b"news", b"", b"hello"], id="publish-7"),
        pytest.param([b"", P, b"PUBLISH", b"x1", b"news", b"hello"], id="publish-6"),
    ],
)
def test_schedule_and_publish_are_acked(frames: list[bytes]) -> None:
    core = make_core()
    core.on_frontend(b"client", frames, 0.0)
    cmds = sent_to(take(core), FRONTEND, b"client")
    assert len(cmds) == 1 and is_ack_of(cmds[0], b"x1")


def test_schedule_is_forwarded_byte_identical_to_the_scheduler() -> None:
    core = make_core()
    core.on_frontend(b"sched", [b"", P, b"INFORM", b"s-inform", b"", b"scheduler"], 0.0)
    take(core)
    frames = [b"", P, b"SCHEDULE", b"x1", b"default", b"guarantee", b"60", BODY, b""]
    core.on_frontend(b"client", frames, 0.0)
    out = take(core)
    assert (FRONTEND, b"sched", frames) in out


# ---- dispatch (the core's choices: test_core_dispatch.py) ---------------------------


def test_dispatched_request_has_eventmq_frames() -> None:
    core = make_core()
    inform(core, b"w")
    ready(core, b"w")
    out = request(core, b"client", b"c1", queue=b"default", headers=b"guarantee")
    assert [m for m in out if m[0] == BACKEND] == [
        (
            BACKEND,
            b"w",
            [b"", P, b"REQUEST", b"c1#1", b"default", b"reply-requested,guarantee", BODY],
        )
    ]


# ---- replies ---------------------------------------------------------------


def test_reply_requested_reply_goes_back_to_the_client_with_its_msgid() -> None:
    core = make_core()
    inform(core, b"w")
    ready(core, b"w")
    request(core, b"client-7", b"c1", headers=b"reply-requested")
    out = reply(core, b"w", b"c1#1", body=b'{"value": 3}')
    replies = [c for c in sent_to(out, FRONTEND, b"client-7") if isinstance(c, Reply)]
    assert len(replies) == 1
    assert replies[0].request_msgid == b"c1" and replies[0].body == b'{"value": 3}'
    assert replies[0].status == b"ok,ready"
    assert [i for s, i, f in out if s == FRONTEND] == [b"client-7"]


def test_eventmq_reply_without_status_reaches_the_client() -> None:
    core = make_core()
    inform(core, b"w")
    ready(core, b"w")
    request(core, b"client", b"c1", headers=b"reply-requested")
    out = reply(core, b"w", b"c1#1", status=None, body=b'{"value": 5}')
    replies = [c for c in sent_to(out, FRONTEND, b"client") if isinstance(c, Reply)]
    assert [(r.request_msgid, r.body) for r in replies] == [(b"c1", b'{"value": 5}')]


def test_no_reply_to_the_client_without_reply_requested() -> None:
    core = make_core()
    inform(core, b"w")
    ready(core, b"w")
    request(core, b"client", b"c1", headers=b"guarantee")
    out = reply(core, b"w", b"c1#1")
    assert [s for s, _, _ in out if s == FRONTEND] == []
    assert core.counters["succeeded"] == 1


@pytest.mark.parametrize(
    ("client_headers", "expected"),
    [
        (b"", b"reply-requested"),
        (b"guarantee,timeout:30", b"reply-requested,guarantee,timeout:30"),
        (b"reply-requested,guarantee", b"reply-requested,guarantee"),
        (b"guarantee,reply-requested", b"guarantee,reply-requested"),
    ],
)
def test_headers_sent_to_the_worker_always_ask_for_a_reply(
    client_headers: bytes, expected: bytes
) -> None:
    core = make_core()
    inform(core, b"w")
    ready(core, b"w")
    (req,) = requests_to(request(core, b"client", b"c1", headers=client_headers), b"w")
    assert req.headers.raw == expected
    assert req.headers.reply_requested
    original = parse_headers(client_headers)
    assert (req.headers.guarantee, req.headers.timeout) == (original.guarantee, original.timeout)


# ---- heartbeats (liveness, the core's part: test_core_liveness.py) ------------------


def test_heartbeats_are_sent_each_interval_to_every_peer() -> None:
    core = make_core()
    core.wall_offset = 1_700_000_000.0
    inform(core, b"w1")
    inform(core, b"w2")
    core.on_frontend(b"sched", [b"", P, b"INFORM", b"si", b"", b"scheduler"], 0.0)
    take(core)
    beats: dict[float, list[tuple[int, bytes]]] = {}
    stamps = []
    for step in range(1, 13):  # 0.25 s steps up to 3 intervals
        now = step * 0.25
        core.on_frontend(b"sched", [b"", P, b"HEARTBEAT", b"sh", b"1"], now)
        for s, i, f in tick(core, now, keep_alive=(b"w1", b"w2")):
            cmd = decode(f)
            if isinstance(cmd, Heartbeat):
                beats.setdefault(now, []).append((s, i))
                stamps.append(cmd.timestamp - 1_700_000_000.0)
        assert core.next_deadline() > now
    expected = [(FRONTEND, b"sched"), (BACKEND, b"w1"), (BACKEND, b"w2")]
    assert {t: sorted(b) for t, b in beats.items()} == {1.0: expected, 2.0: expected, 3.0: expected}
    assert stamps == pytest.approx([1.0] * 3 + [2.0] * 3 + [3.0] * 3)


MANAGER = {"role": "manager", "manager": "jm1", "host": "h", "pid": 100, "concurrency": 2}


def slot_meta(n: int, manager: str = "jm1") -> dict[str, Any]:
    return {"role": "slot", "manager": manager, "slot": n, "pid": 200 + n}


# the held-attempts scene over eMQP (test_reconnect.py; test_held_attempts.py has it on
# typed effects)
AT_MOST_ONCE = b"reply-requested"


def replies_to(out: Any, client: bytes = b"client") -> dict[bytes, Reply]:
    return {c.request_msgid: c for c in sent_to(out, FRONTEND, client) if isinstance(c, Reply)}


def busy_slot(core: EmqpMachine, jobs: dict[bytes, bytes]) -> None:
    """The job manager ``mgr`` with slot0 holding ``jobs`` (msgid -> headers), in
    order, and slot1 ready for one job (what goes back to the queue goes there)."""
    inform(core, b"mgr", meta=MANAGER)
    inform(core, b"slot0", meta=slot_meta(0))
    ready(core, b"slot0", times=len(jobs))
    for msgid, headers in jobs.items():
        request(core, b"client", msgid, headers=headers)
    assert all(core.inflight[m + b"#1"].peer.identity == b"slot0" for m in jobs)
    inform(core, b"slot1", meta=slot_meta(1))


def lose_slot0(core: EmqpMachine, now: float = 0.1) -> None:
    """The broker finds slot0 unreachable before its job manager's word."""
    core.peer_unreachable(BACKEND, b"slot0", now)
    assert b"slot0" not in core.peers


# ---- goodbyes --------------------------------------------------------------


def test_worker_disconnect_gets_kbye_no_new_jobs_and_its_reply_is_accepted() -> None:
    core = make_core()
    inform(core, b"w")
    ready(core, b"w", times=3)
    request(core, b"client", b"busy", headers=b"reply-requested")
    core.on_backend(b"w", [b"", P, b"DISCONNECT", b"bye"], 1.0)
    assert [type(c) for c in sent_to(take(core), BACKEND, b"w")] == [Kbye]
    # credit is withdrawn: new work waits
    assert requests_to(request(core, b"client", b"later"), b"w") == []
    assert [j.id for j in core.queues["default"].pending] == [b"later"]
    # the job in flight still completes and reaches the client
    out = reply(core, b"w", b"busy#1", status=b"ok,ready", now=1.5)
    assert requests_to(out, b"w") == []  # its `ready` gives no new work
    assert [c.request_msgid for c in sent_to(out, FRONTEND, b"client")] == [b"busy"]
    assert core.counters["succeeded"] == 1 and core.counters["stale_replies"] == 0
    assert b"w" not in core.peers  # gone once idle
    assert [j.id for j in core.queues["default"].pending] == [b"later"]


def test_idle_worker_disconnect_is_dropped_at_once() -> None:
    core = make_core()
    inform(core, b"w")
    ready(core, b"w")
    core.on_backend(b"w", [b"", P, b"DISCONNECT", b"bye"], 1.0)
    assert [type(c) for c in sent_to(take(core), BACKEND, b"w")] == [Kbye]
    assert b"w" not in core.peers
    assert core.queues["default"].pick() is None


@pytest.mark.parametrize("command", [b"KBYE", b"KBAI"])
def test_our_worker_process_kbye_drops_it_and_requeues_its_jobs(command: bytes) -> None:
    core = make_core()
    inform(core, b"mgr", meta=MANAGER)
    inform(core, b"w", meta=slot_meta(0))
    ready(core, b"w")
    request(core, b"client", b"j")
    core.on_backend(b"w", [b"", P, command, b"bye"], 1.0)
    assert b"w" not in core.peers
    assert [j.id for j in core.queues["default"].pending] == [b"j"]


@pytest.mark.parametrize("command", [b"KBYE", b"KBAI"])
def test_eventmq_job_manager_kbye_lets_its_jobs_finish_and_takes_their_replies(
    command: bytes,
) -> None:
    """EventMQ's job manager says KBYE at once on SIGTERM, then finishes its jobs
    and REPLYs (issue 29, item 4): an at-most-once job must not run again."""
    core = make_core()
    inform(core, b"w")
    ready(core, b"w")
    request(core, b"client", b"j", headers=b"reply-requested")
    inform(core, b"other")
    ready(core, b"other")
    core.on_backend(b"w", [b"", P, command, b"bye"], 1.0)
    out = take(core)
    assert not requests_to(out, b"other") and not core.queues["default"].pending
    assert b"w" in core.peers and core.queues["default"].pick() is core.peers[b"other"]
    for now in (5.0, 10.0, 20.0):  # it beats no more while it finishes: still waited for
        tick(core, now, keep_alive=(b"other",))
    out = reply(core, b"w", b"j#1", now=20.5)
    (answer,) = [c for c in sent_to(out, FRONTEND, b"client") if isinstance(c, Reply)]
    assert answer.body == b'{"value": 3}'
    assert b"w" not in core.peers  # its last job done: gone
    assert core.counters["stale_replies"] == 0 and core.counters["requeued"] == 0


def test_eventmq_job_manager_gone_after_kbye_counts_its_jobs_as_attempts() -> None:
    core = make_core()
    inform(core, b"w")
    ready(core, b"w")
    request(core, b"client", b"j", headers=b"reply-requested")
    core.on_backend(b"w", [b"", P, b"KBYE", b"bye"], 1.0)
    core.peer_unreachable(BACKEND, b"w", 2.0)  # it exited without a REPLY
    out = take(core)
    (answer,) = [c for c in sent_to(out, FRONTEND, b"client") if isinstance(c, Reply)]
    assert json.loads(answer.body)["error"]["type"] == "emq_django.exceptions.WorkerLost"
    assert core.counters["worker_lost"] == 1 and core.counters["requeued"] == 0


def test_stale_reply_is_counted_and_ignored() -> None:
    core = make_core()
    inform(core, b"w")
    ready(core, b"w")
    request(core, b"client", b"j", headers=b"reply-requested")
    out = reply(core, b"w", b"no-such-job#1")
    assert core.counters["stale_replies"] == 1
    assert [s for s, _, _ in out if s == FRONTEND] == []
    assert b"j#1" in core.inflight
    assert core.counters["succeeded"] == 0


def test_reply_for_an_attempt_that_was_requeued_is_stale() -> None:
    core = make_core()
    inform(core, b"slow")
    ready(core, b"slow")
    request(core, b"client", b"j", headers=b"reply-requested,retry-count:1")
    inform(core, b"other")
    ready(core, b"other")
    for now in (1.0, 2.0, 3.0, 11.0, 12.5):  # dropped at 11, retried after the backoff
        tick(core, now, keep_alive=(b"other",))
    assert list(core.inflight) == [b"j#2"]
    inform(core, b"slow", now=12.6)  # it comes back and answers the first attempt
    out = reply(core, b"slow", b"j#1", now=12.6)
    assert core.counters["stale_replies"] == 1
    assert [s for s, _, _ in out if s == FRONTEND] == []
    out = reply(core, b"other", b"j#2", now=12.7)
    assert [c.request_msgid for c in sent_to(out, FRONTEND, b"client")] == [b"j"]
    assert core.counters["succeeded"] == 1


def test_reply_from_the_wrong_worker_is_stale() -> None:
    core = make_core()
    inform(core, b"a")
    inform(core, b"b")
    ready(core, b"a")
    request(core, b"client", b"j")
    reply(core, b"b", b"j#1")
    assert core.counters["stale_replies"] == 1 and b"j#1" in core.inflight


@pytest.mark.parametrize(
    "frames",
    [
        pytest.param([b"", P, b"READY", b"r"], id="ready"),
        pytest.param([b"", P, b"HEARTBEAT", b"h", b"1.0"], id="heartbeat"),
        pytest.param([b"", P, b"REPLY", b"r", b"{}", b"x#1", b"ok,ready"], id="reply"),
    ],
)
def test_unknown_peer_is_counted_and_not_answered(frames: list[bytes]) -> None:
    # No KBYE: EventMQ's job manager ignores it, and any message resets its 15 s
    # reconnect timer, so an answer would keep it away for good.
    core = make_core()
    core.on_backend(b"stranger", frames, 0.0)
    out = take(core)
    assert sent_to(out, BACKEND, b"stranger") == []
    assert core.counters["unknown_peer"] == 1
    assert b"stranger" not in core.peers


def test_begin_shutdown_sends_kbye_to_every_peer_and_refuses_new_jobs() -> None:
    core = make_core()
    inform(core, b"w1")
    inform(core, b"w2")
    core.on_frontend(b"sched", [b"", P, b"INFORM", b"si", b"", b"scheduler"], 0.0)
    take(core)
    core.begin_shutdown()
    out = take(core)
    kbyes = sorted((s, i) for s, i, f in out if isinstance(decode(f), Kbye))
    assert kbyes == [(FRONTEND, b"sched"), (BACKEND, b"w1"), (BACKEND, b"w2")]
    assert len(out) == 3
    core.begin_shutdown()
    assert take(core) == []  # only once
    cmds = sent_to(request(core, b"client", b"late"), FRONTEND, b"client")
    assert isinstance(cmds[0], Error) and cmds[0].code == "shutting-down"


def test_shutdown_waits_for_jobs_in_flight() -> None:
    core = make_core()
    inform(core, b"w")
    ready(core, b"w")
    request(core, b"client", b"j")
    core.begin_shutdown()
    assert not core.drained
    reply(core, b"w", b"j#1")
    assert core.drained


# ---- malformed input ---------------------------------------------------------

MALFORMED = [
    [],
    [b""],
    [b"junk"],
    [b"x", P, b"READY", b"m"],
    [b"", b"eMQP/0.9", b"READY", b"m"],
    [b"", P, b"NOPE", b"m"],
    [b"", P, b"READY", b""],
    [b"", P, b"REQUEST", b"m", b"q"],
    [b"", P, b"REQUEST", b"m", b"\xff\xfe", b"", BODY],
    [b"", P, b"REQUEST", b"m", b"q", b"retry-count:-1", BODY],
    [b"", P, b"INFORM", b"m", b"{}", b"worker"],
    [b"", P, b"INFORM", b"m", b"", b"toaster"],
    [b"", P, b"SCHEDULE", b"m", b"q", b"", b"-7", BODY, b""],
    [b"", P, b"HEARTBEAT", b"m", b"noon"],
    [b"\x00" * 1000, b"\xff" * 10],
]


def test_malformed_frames_are_counted_and_never_raise() -> None:
    core = make_core()
    inform(core, b"w")
    for frames in MALFORMED:
        core.on_frontend(b"client", frames, 0.0)
        core.on_backend(b"w", frames, 0.0)
        core.on_backend(b"stranger", frames, 0.0)
    assert core.counters["protocol_errors"] == 3 * len(MALFORMED)
    # a command its sender waits on, with a msgid, is answered with an ERROR (issue 12:
    # it used to be dropped silently); the rest is dropped and counted
    errors = [(sock, ident, decode(frames)) for sock, ident, frames in take(core)]
    assert all(isinstance(cmd, Error) and cmd.ref_msgid == b"m" for _, _, cmd in errors)
    answered = {(sock, ident, cmd.code) for sock, ident, cmd in errors}
    assert answered == {
        (FRONTEND, b"client", "malformed"),  # REQUEST with 5 frames
        (FRONTEND, b"client", "bad-queue-name"),
        (FRONTEND, b"client", "bad-header"),
        (FRONTEND, b"client", "unknown-command"),
        (FRONTEND, b"client", "malformed"),  # INFORM, SCHEDULE
        (BACKEND, b"w", "malformed"),  # INFORM
        (BACKEND, b"stranger", "malformed"),
    }
    assert core.counters["refused"] == len(errors)
    assert core.counters["dropped_malformed"] == 3 * len(MALFORMED) - len(errors)


@pytest.mark.parametrize(
    ("port", "frames"),
    [
        pytest.param(FRONTEND, [b"", P, b"READY", b"m"], id="ready-on-frontend"),
        pytest.param(FRONTEND, [b"", P, b"REPLY", b"m", b"{}", b"x#1"], id="reply-on-frontend"),
        pytest.param(FRONTEND, [b"", P, b"INFORM", b"m", b"", b"worker"], id="worker-on-frontend"),
        pytest.param(BACKEND, [b"", P, b"REQUEST", b"m", b"q", b"", BODY], id="request-on-backend"),
        pytest.param(BACKEND, [b"", P, b"INFORM", b"m", b"", b"scheduler"], id="sched-on-backend"),
        pytest.param(
            BACKEND, [b"", P, b"SCHEDULE", b"m", b"q", b"", BODY], id="schedule-on-backend"
        ),
    ],
)
def test_command_on_the_wrong_port_is_a_protocol_error(port: int, frames: list[bytes]) -> None:
    core = make_core()
    handler = core.on_frontend if port == FRONTEND else core.on_backend
    handler(b"peer", frames, 0.0)
    assert core.counters["protocol_errors"] == 1
    assert not core.peers and not core.schedulers and not core.inflight


def test_random_frames_never_break_the_core() -> None:
    rng = random.Random(1234)
    core = make_core()
    inform(core, b"w")
    words = [
        b"",
        P,
        b"REQUEST",
        b"REPLY",
        b"READY",
        b"INFORM",
        b"HEARTBEAT",
        b"KBYE",
        b"DISCONNECT",
        b"SCHEDULE",
        b"worker",
        b"default",
        b"-1",
        b"\xff",
        b"ok,ready",
    ]
    for n in range(3000):
        frames = [
            rng.choice(words) if rng.random() < 0.7 else rng.randbytes(rng.randint(0, 20))
            for _ in range(rng.randint(0, 10))
        ]
        if rng.random() < 0.5:
            frames[:4] = [b"", P, rng.choice(words), b"m%d" % n]
        ident = rng.choice([b"w", b"client", b"x"])
        (core.on_frontend if n % 2 else core.on_backend)(ident, frames, n / 100)
        core.on_timer(n / 100)
        take(core)
    # valid traffic still works afterwards
    now = 31.0
    inform(core, b"fresh", now=now)
    ready(core, b"fresh", now=now)
    out = request(core, b"client", b"final", queue=b"final-q", now=now)
    assert is_ack_of(sent_to(out, FRONTEND, b"client")[0], b"final")


# ---- monitor documents -------------------------------------------------------


def _monitor_core() -> EmqpMachine:
    core = make_core()
    inform(core, b"mgr", b'[[40, "email"], [10, "default"]]', meta=MANAGER)
    inform(core, b"slot0", b'[[40, "email"], [10, "default"]]', meta=slot_meta(0))
    inform(core, b"slot1", b'[[40, "email"], [10, "default"]]', meta=slot_meta(1))
    inform(core, b"legacy", b'[[10, "default"]]')
    ready(core, b"slot0")
    ready(core, b"slot1")
    ready(core, b"legacy", times=3)
    request(core, b"client", b"e1", queue=b"email")  # -> a slot
    request(core, b"client", b"r1", queue=b"reports")  # nobody serves it: waits
    request(core, b"client", b"r2", queue=b"reports")
    core.on_frontend(b"client", [b"", P, b"BOGUS", b"m"], 0.0)
    return core


def test_monitor_snapshot_lists_queues_with_depth_and_servers() -> None:
    core = _monitor_core()
    doc = monitor.snapshot(core.core, 10.0, 1_700_000_010.0, {"pid": 1})
    queues = {q["name"]: q for q in doc["queues"]}
    assert set(queues) == {"default", "email", "reports"}
    assert (queues["email"]["depth"], queues["email"]["in_flight"]) == (0, 1)
    assert (queues["reports"]["depth"], queues["reports"]["in_flight"]) == (2, 0)
    assert queues["reports"]["job_managers"] == []
    servers = {e["identity"]: e for e in queues["default"]["job_managers"]}
    assert set(servers) == {"jm1", "legacy"}
    assert servers["jm1"]["weight"] == 10 and servers["jm1"]["free_slots"] == 1
    assert servers["legacy"]["free_slots"] == 3
    email = {e["identity"]: e for e in queues["email"]["job_managers"]}
    assert email["jm1"]["weight"] == 40
    assert doc["in_flight"] == 1
    assert doc["broker"]["uptime"] == 10.0 and doc["broker"]["pid"] == 1


def test_monitor_groups_job_managers_one_entry_each() -> None:
    core = _monitor_core()
    doc = monitor.snapshot(core.core, 10.0, 1_700_000_010.0, {})
    managers = {e["identity"]: e for e in doc["job_managers"]}
    assert set(managers) == {"jm1", "legacy"}
    ours = managers["jm1"]
    assert ours["kind"] == "emq" and ours["host"] == "h" and ours["pid"] == 100
    assert (ours["slots"], ours["free_slots"], ours["busy"]) == (2, 1, 1)
    theirs = managers["legacy"]
    assert theirs["kind"] == "eventmq"
    assert (theirs["slots"], theirs["free_slots"], theirs["busy"]) == (3, 3, 0)
    assert theirs["queues"] == [[10, "default"]]
    assert theirs["last_heartbeat"] == pytest.approx(1_700_000_000.0)


def test_monitor_counters_are_all_present() -> None:
    core = _monitor_core()
    doc = monitor.snapshot(core.core, 10.0, 1_700_000_010.0, {})
    assert set(COUNTERS) <= set(doc["counters"])
    assert doc["counters"]["protocol_errors"] == 1
    assert doc["counters"]["received"] == 3 and doc["counters"]["dispatched"] == 1


def test_monitor_json_and_lines() -> None:
    core = _monitor_core()
    doc = monitor.snapshot(core.core, 10.0, 1_700_000_010.0, {"pid": 1})
    assert json.loads(monitor.as_json(doc)) == doc
    text = monitor.as_lines(doc).decode()
    lines = dict(line.split(": ", 1) for line in text.splitlines())
    assert lines["messages"] == "2"
    assert lines["messages_inflight"] == "1"
    assert lines["job_managers"] == "2"
    assert lines["queue.reports.depth"] == "2"
    assert lines["protocol_errors"] == "1"
    assert text.endswith("\n")


@pytest.mark.parametrize(
    "rogue_meta",
    [
        pytest.param({"role": "manager"}, id="manager-without-name"),
        pytest.param({"role": "manager", "manager": ""}, id="manager-empty-name"),
    ],
)
def test_nameless_manager_cannot_answer_for_a_plain_workers_job(rogue_meta: dict[str, Any]) -> None:
    core = make_core()
    inform(core, b"eventmq-w")  # a plain (EventMQ) job manager: no meta
    ready(core, b"eventmq-w")
    request(core, b"client", b"j", headers=b"reply-requested")
    inform(core, b"rogue", meta=rogue_meta)
    out = reply(core, b"rogue", b"j#1", status=b"failed,lost")
    assert core.counters["stale_replies"] == 1
    assert [s for s, _, _ in out if s == FRONTEND] == []
    assert b"eventmq-w" in core.peers and b"j#1" in core.inflight


def test_eventmq_peer_gets_its_own_heartbeat_allowance() -> None:
    """EventMQ's job manager beats every 3 s whatever our interval: with a 0.5 s
    interval it must not be dropped after 1.5 s, only after 3 s x liveness."""
    core = EmqpMachine(BrokerConfig(heartbeat_interval=0.5, heartbeat_liveness=3), 0.0)
    inform(core, b"emq-jm")
    core.on_timer(2.0)
    assert b"emq-jm" in core.peers
    core.on_timer(10.5)
    assert b"emq-jm" not in core.peers
