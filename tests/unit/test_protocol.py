"""eMQP/1.0 codec: every command round-trips, and malformed input raises ProtocolError."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emq_django.exceptions import ProtocolError
from emq_django.protocol import (
    PROTOCOL,
    Ack,
    Disconnect,
    Error,
    Headers,
    Heartbeat,
    Inform,
    Kbye,
    Publish,
    Ready,
    Reply,
    Request,
    RunBody,
    Schedule,
    Unschedule,
    decode,
    decode_run_body,
    encode_run_body,
    format_headers,
    parse_headers,
    parse_queues,
)
from emq_django.protocol.frames import encode_heartbeat, reply_retry
from emq_django.protocol.memory_report import encode_memory

P = PROTOCOL
BODY = (
    b'["run", {"callable": "add", "path": "tasks_pkg.demo.tasks", "args": [2, 3], '
    b'"kwargs": {}, "class_args": [], "class_kwargs": {}}]'
)
H_FULL = parse_headers(b"reply-requested,guarantee,retry-count:3,timeout:30")


# ---- round trips -----------------------------------------------------------

ROUND_TRIP = [
    pytest.param(Ack(b"a1", b"m1"), [b"", P, b"ACK", b"a1", b"m1"], id="ack"),
    pytest.param(
        Reply(b"r1", b'{"value": 5}'),
        [b"", P, b"REPLY", b"r1", b'{"value": 5}'],
        id="reply-document-form",
    ),
    pytest.param(
        Reply(b"r1", b'{"value": 5}', b"req-1"),
        [b"", P, b"REPLY", b"r1", b'{"value": 5}', b"req-1"],
        id="reply-eventmq-form",
    ),
    pytest.param(
        Reply(b"r1", b'{"value": 5}', b"req-1", b"ok,ready"),
        [b"", P, b"REPLY", b"r1", b'{"value": 5}', b"req-1", b"ok,ready"],
        id="reply-with-status",
    ),
    pytest.param(
        Heartbeat(b"h1", 1700000000.25),
        [b"", P, b"HEARTBEAT", b"h1", b"1700000000.25"],
        id="heartbeat",
    ),
    pytest.param(Disconnect(b"d1"), [b"", P, b"DISCONNECT", b"d1"], id="disconnect"),
    pytest.param(Kbye(b"k1"), [b"", P, b"KBYE", b"k1"], id="kbye"),
    pytest.param(
        Request(b"q1", "email", H_FULL, BODY),
        [
            b"",
            P,
            b"REQUEST",
            b"q1",
            b"email",
            b"reply-requested,guarantee,retry-count:3,timeout:30",
            BODY,
        ],
        id="request",
    ),
    pytest.param(
        Request(b"q2", "default", Headers(), BODY),
        [b"", P, b"REQUEST", b"q2", b"default", b"", BODY],
        id="request-no-headers",
    ),
    pytest.param(
        Publish(b"p1", "news", parse_headers(b"guarantee"), b"hello"),
        [b"", P, b"PUBLISH", b"p1", b"news", b"guarantee", b"hello"],
        id="publish-7-frames",
    ),
    pytest.param(
        Schedule(b"s1", "default", parse_headers(b"guarantee"), BODY),
        [b"", P, b"SCHEDULE", b"s1", b"default", b"guarantee", BODY],
        id="schedule-7-frames",
    ),
    pytest.param(
        Schedule(b"s2", "default", parse_headers(b"guarantee"), BODY, 60, ""),
        [b"", P, b"SCHEDULE", b"s2", b"default", b"guarantee", b"60", BODY, b""],
        id="schedule-9-frames-interval",
    ),
    pytest.param(
        Schedule(b"s3", "default", parse_headers(b"nohaste"), BODY, -1, "*/5 * * * *"),
        [b"", P, b"SCHEDULE", b"s3", b"default", b"nohaste", b"-1", BODY, b"*/5 * * * *"],
        id="schedule-9-frames-cron",
    ),
    pytest.param(
        Unschedule(b"u1", "default", parse_headers(b"guarantee"), BODY),
        [b"", P, b"UNSCHEDULE", b"u1", b"default", b"guarantee", BODY],
        id="unschedule-7-frames",
    ),
    pytest.param(
        Unschedule(b"u2", "email", parse_headers(b"guarantee"), BODY, 60, ""),
        [b"", P, b"UNSCHEDULE", b"u2", b"email", b"guarantee", b"60", BODY, b""],
        id="unschedule-9-frames",
    ),
    pytest.param(
        Unschedule(b"u3", "default", parse_headers(b"guarantee"), BODY, -1, "0 * * * *"),
        [b"", P, b"UNSCHEDULE", b"u3", b"default", b"guarantee", b"-1", BODY, b"0 * * * *"],
        id="unschedule-9-frames-cron",
    ),
    pytest.param(
        Inform(b"i1", ((40, "email"), (10, "default")), "worker"),
        [b"", P, b"INFORM", b"i1", b'[[40, "email"], [10, "default"]]', b"worker"],
        id="inform-worker",
    ),
    pytest.param(
        Inform(b"i2", (), "scheduler"),
        [b"", P, b"INFORM", b"i2", b"", b"scheduler"],
        id="inform-scheduler",
    ),
    pytest.param(
        Inform(b"i3", ((10, "default"),), "worker", {"role": "slot", "manager": "jm-1", "pid": 42}),
        [
            b"",
            P,
            b"INFORM",
            b"i3",
            b'[[10, "default"]]',
            b"worker",
            b'{"role":"slot","manager":"jm-1","pid":42}',
        ],
        id="inform-with-meta",
    ),
    pytest.param(Ready(b"y1"), [b"", P, b"READY", b"y1"], id="ready"),
    pytest.param(
        Error(b"e1", b"q1", "queue 'x' is full", "queue-full"),
        [b"", P, b"ERROR", b"e1", b"q1", b"queue-full", b"queue 'x' is full"],
        id="error",
    ),
]


@pytest.mark.parametrize(("command", "frames"), ROUND_TRIP)
def test_command_encodes_to_frames_and_decodes_back(command: object, frames: list[bytes]) -> None:
    assert command.encode() == frames  # type: ignore[attr-defined]
    assert decode(frames) == command


def test_kbai_from_the_document_decodes_to_kbye() -> None:
    assert decode([b"", P, b"KBAI", b"k9"]) == Kbye(b"k9")
    assert Kbye(b"k9").encode()[2] == b"KBYE"  # what EventMQ peers understand


def test_publish_6_frames_from_the_document_has_no_headers() -> None:
    cmd = decode([b"", P, b"PUBLISH", b"p2", b"news", b"hello"])
    assert cmd == Publish(b"p2", "news", Headers(), b"hello")


@pytest.mark.parametrize(("interval", "cron"), [(b"-1", b""), (b"60", b""), (b"-1", b"0 * * * *")])
def test_unschedule_as_eventmq_sends_it_decodes(interval: bytes, cron: bytes) -> None:
    # messages.schedule(..., unschedule=True) sends str(interval_secs or -1) and cron or '':
    # the scheduler ignores both for UNSCHEDULE, so '-1' with no cron must be accepted.
    frames = [b"", P, b"UNSCHEDULE", b"2190", b"default", b"guarantee", interval, BODY, cron]
    cmd = decode(frames)
    assert isinstance(cmd, Unschedule)
    assert (cmd.msgid, cmd.queue, cmd.body) == (b"2190", "default", BODY)
    assert cmd.encode() == frames  # forwarded to schedulers byte-identical


def test_heartbeat_without_timestamp_decodes() -> None:
    assert decode([b"", P, b"HEARTBEAT", b"h2"]) == Heartbeat(b"h2", 0.0)
    # our job manager's memory report, a sixth frame (protocol/memory_report.py)
    beat = decode(encode_heartbeat(b"h3", 1.5, encode_memory(10, {7: 20})))
    assert beat == Heartbeat(b"h3", 1.5, {"rss": 10, "processes": {"7": 20}})


def test_reply_status_flags() -> None:
    reply = decode([b"", P, b"REPLY", b"r", b"{}", b"req", b"failed,lost"])
    assert isinstance(reply, Reply)
    assert reply.failed and not reply.ready
    ok = Reply(b"r", b"{}", b"req", b"ok,ready")
    assert ok.ready and not ok.failed
    assert not Reply(b"r", b"{}").ready  # EventMQ's REPLY gives no credit back


@pytest.mark.parametrize(
    ("status", "delay"),
    [
        (b"failed", None),
        (b"failed,retry", -1.0),
        (b"failed,retry:2.5", 2.5),
        (b"failed,retry:-3", 0.0),
        (b"failed,retry:x", -1.0),  # not a number: the backoff
        (b"failed,retry:inf", -1.0),  # ... nor one a job could wait for
        (b"failed,retry:nan", -1.0),
    ],
)
def test_reply_retry_delay(status: bytes, delay: float | None) -> None:
    assert reply_retry(status) == delay


def test_request_decodes_eventmq_frames_as_observed() -> None:
    cmd = decode(
        [
            b"",
            P,
            b"REQUEST",
            b"0547f5af",
            b"email",
            b"reply-requested,guarantee,retry-count:3,timeout:30",
            BODY,
        ]
    )
    assert isinstance(cmd, Request)
    assert cmd.queue == "email"
    assert cmd.headers.reply_requested and cmd.headers.guarantee
    assert cmd.headers.retry_count == 3 and cmd.headers.timeout == 30.0
    assert cmd.body == BODY


# ---- INFORM queues -----------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "queues"),
    [
        pytest.param(
            b'[[10, "default"], [40, "email"]]',
            ((40, "email"), (10, "default")),
            id="json-sorted-highest-first",
        ),
        pytest.param(b"", (), id="empty"),
        pytest.param(b"[]", (), id="empty-list"),
        pytest.param(b'[40, "email"]', ((40, "email"),), id="single-pair-json"),
        pytest.param(b"[40, 'email']", ((40, "email"),), id="document-single-quoted-pair"),
        pytest.param(
            b"[40, 'email'], [10, 'default']",
            ((40, "email"), (10, "default")),
            id="document-single-quoted-pairs",
        ),
        pytest.param(
            b'[40, "email"], [10, "default"]',
            ((40, "email"), (10, "default")),
            id="pairs-without-outer-list",
        ),
        pytest.param(b"email:40,default", ((40, "email"), (10, "default")), id="name-colon-weight"),
    ],
)
def test_inform_queues_are_parsed(frame: bytes, queues: tuple[tuple[int, str], ...]) -> None:
    assert parse_queues(frame) == queues
    cmd = decode([b"", P, b"INFORM", b"i", frame, b"worker"])
    assert isinstance(cmd, Inform)
    assert cmd.queues == queues


# ---- headers ---------------------------------------------------------------


def test_headers_full_set() -> None:
    h = parse_headers(b"reply-requested,guarantee,retry-count:3,timeout:30")
    assert (h.reply_requested, h.guarantee, h.nohaste) == (True, True, False)
    assert h.retry_count == 3
    assert h.timeout == 30.0
    assert h.raw == b"reply-requested,guarantee,retry-count:3,timeout:30"
    assert h.extra == ()


def test_headers_nohaste() -> None:
    h = parse_headers(b"nohaste")
    assert h.nohaste and not h.reply_requested and not h.guarantee


def test_headers_run_after_with_value() -> None:
    assert parse_headers(b"run-after:1700000000.250000").run_after == 1700000000.25


def test_headers_run_after_without_value_is_refused() -> None:
    with pytest.raises(ProtocolError, match="run-after"):
        parse_headers(b"run-after:")


def test_headers_unknown_extras_are_kept() -> None:
    h = parse_headers(b"guarantee,run_count:5,x-trace,color:blue:green")
    assert h.guarantee
    assert h.extra == (("run_count", "5"), ("x-trace", ""), ("color", "blue:green"))
    assert h.get("run_count") == "5"
    assert h.get("x-trace") == ""
    assert h.get("missing") is None
    assert h.get("missing", "d") == "d"


@pytest.mark.parametrize("raw", [b"", b",", b" , "])
def test_headers_empty(raw: bytes) -> None:
    h = parse_headers(raw)
    assert not (h.reply_requested or h.guarantee or h.nohaste)
    assert (h.retry_count, h.timeout, h.run_after, h.extra) == (0, 0.0, 0.0, ())


@pytest.mark.parametrize(
    ("kwargs", "raw"),
    [
        pytest.param({}, b"", id="none"),
        pytest.param(
            {"reply_requested": True, "guarantee": True, "retry_count": 3, "timeout": 30},
            b"reply-requested,guarantee,retry-count:3,timeout:30",
            id="eventmq-order",
        ),
        pytest.param({"nohaste": True}, b"nohaste", id="nohaste"),
        pytest.param({"timeout": 2.5}, b"timeout:2.5", id="fractional-timeout"),
        pytest.param({"run_after": 1700000000.25}, b"run-after:1700000000.250000", id="run-after"),
        pytest.param(
            {"extra": (("run_count", "5"), ("x-trace", ""))}, b"run_count:5,x-trace", id="extra"
        ),
    ],
)
def test_format_headers(kwargs: dict[str, object], raw: bytes) -> None:
    assert format_headers(**kwargs) == raw  # type: ignore[arg-type]
    parsed = parse_headers(raw)
    for key, value in kwargs.items():
        assert getattr(parsed, key) == value


# ---- run body --------------------------------------------------------------


def test_run_body_round_trip() -> None:
    body = encode_run_body("tasks_pkg.demo.tasks", "add", (2, 3), {"x": "é"})
    data = json.loads(body)
    assert data[0] == "run"
    assert data[1]["path"] == "tasks_pkg.demo.tasks" and data[1]["callable"] == "add"
    decoded = decode_run_body(body)
    assert decoded == RunBody("tasks_pkg.demo.tasks", "add", [2, 3], {"x": "é"})
    assert decoded.task_name == "tasks_pkg.demo.tasks.add"


def test_run_body_decodes_eventmq_class_form() -> None:
    body = (
        b'["run", {"callable": "plus", "path": "tasks_pkg.demo.tasks:Calc", "args": [5], '
        b'"kwargs": {}, "class_args": [10], "class_kwargs": {"x": 1}}]'
    )
    decoded = decode_run_body(body)
    assert decoded == RunBody("tasks_pkg.demo.tasks:Calc", "plus", [5], {}, [10], {"x": 1})
    assert decoded.task_name == "tasks_pkg.demo.tasks:Calc.plus"


@pytest.mark.parametrize(
    "body",
    [
        b' ["run", {"path": "p", "callable": "f", "args": [1]}]',  # leading space
        '["run", {"path": "p", "callable": "f", "args": [1]}]'.encode("utf-16"),
        '["run", {"path": "p", "callable": "f", "args": [1]}]'.encode("utf-8-sig"),
    ],
)
def test_run_body_decodes_what_json_loads_decodes(body: bytes) -> None:
    """Bodies off the fast path (not starting with '["') decode as json.loads does."""
    assert decode_run_body(body) == RunBody("p", "f", [1])


def test_run_body_that_is_not_utf8_is_refused() -> None:
    with pytest.raises(ProtocolError, match="not JSON"):
        decode_run_body(b'["run", {"path": "p\xff", "callable": "f"}]')


@pytest.mark.parametrize("args", [(object(),), ({1, 2},), (float("nan"),), (b"bytes",)])
def test_run_body_refuses_non_json_arguments(args: tuple[object, ...]) -> None:
    with pytest.raises(TypeError, match="JSON"):
        encode_run_body("pkg.mod", "f", args)


def test_run_body_refuses_non_json_kwargs() -> None:
    with pytest.raises(TypeError):
        encode_run_body("pkg.mod", "f", (), {"when": object()})


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"\xff\xfe",
        b"{}",
        b'["run"]',
        b'["call", {"path": "a", "callable": "b"}]',
        b'["run", []]',
        b'["run", {"path": "a"}]',
        b'["run", {"path": "", "callable": "b"}]',
        b'["run", {"path": "a", "callable": "b", "args": {"a": 1}}]',
        b'["run", {"path": "a", "callable": "b", "kwargs": [1]}]',
        b'["run", {"path": "a", "callable": "b", "class_args": "xy"}]',
    ],
)
def test_run_body_malformed(body: bytes) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_run_body(body)
    assert info.value.reason


# ---- malformed frames ------------------------------------------------------


def _inform(queues: bytes, peer: bytes = b"worker", *meta: bytes) -> list[bytes]:
    return [b"", P, b"INFORM", b"i", queues, peer, *meta]


def _request(queue: bytes = b"q", headers: bytes = b"") -> list[bytes]:
    return [b"", P, b"REQUEST", b"m", queue, headers, b"body"]


MALFORMED = [
    # (frames, words the reason must contain)
    pytest.param([], "too few", id="no-frames"),
    pytest.param([b""], "too few", id="one-frame"),
    pytest.param([b"", P, b"READY"], "too few", id="three-frames"),
    pytest.param([b"x", P, b"READY", b"m"], "first frame", id="non-empty-first-frame"),
    pytest.param([b"", b"eMQP/2.0", b"READY", b"m"], "protocol", id="wrong-protocol"),
    pytest.param([b"", b"MDPC02", b"READY", b"m"], "protocol", id="other-protocol"),
    pytest.param([b"", P, b"FROB", b"m"], "unknown command", id="unknown-command"),
    pytest.param([b"", P, b"ready", b"m"], "unknown command", id="lower-case-command"),
    pytest.param([b"", P, b"READY", b""], "msgid", id="empty-msgid"),
    pytest.param([b"", P, b"READY", b"m" * 256], "msgid", id="oversized-msgid"),
    pytest.param([b"", P, b"ACK", b"m"], "ACK needs 5", id="ack-4"),
    pytest.param([b"", P, b"ACK", b"m", b"a", b"b"], "ACK needs 5", id="ack-6"),
    pytest.param([b"", P, b"REPLY", b"m"], "REPLY needs", id="reply-4"),
    pytest.param([b"", P, b"REPLY", b"m", b"b", b"r", b"s", b"x"], "REPLY needs", id="reply-8"),
    pytest.param(
        [b"", P, b"REPLY", b"m", b"b", b"r", b"s" * 256], "status", id="reply-long-status"
    ),
    pytest.param(
        [b"", P, b"HEARTBEAT", b"m", b"1", b"{}", b"x"], "HEARTBEAT needs", id="heartbeat-7"
    ),
    pytest.param([b"", P, b"HEARTBEAT", b"m", b"1", b"x"], "memory report", id="heartbeat-6-bad"),
    pytest.param([b"", P, b"HEARTBEAT", b"m", b"yesterday"], "timestamp", id="heartbeat-bad-ts"),
    pytest.param([b"", P, b"DISCONNECT", b"m", b"x"], "DISCONNECT needs", id="disconnect-5"),
    pytest.param([b"", P, b"KBYE", b"m", b"x"], "KBYE needs", id="kbye-5"),
    pytest.param([b"", P, b"KBAI", b"m", b"x"], "needs 4", id="kbai-5"),
    pytest.param([b"", P, b"READY", b"m", b"x"], "READY needs", id="ready-5"),
    pytest.param([b"", P, b"REQUEST", b"m", b"q", b""], "REQUEST needs 7", id="request-6"),
    pytest.param([*_request(), b"x"], "REQUEST needs 7", id="request-8"),
    pytest.param(_request(queue=b""), "empty queue", id="request-empty-queue"),
    pytest.param(_request(queue=b"q\xff\xfe"), "UTF-8", id="request-non-utf8-queue"),
    pytest.param(_request(queue=b"q" * 256), "longer", id="request-long-queue"),
    pytest.param(_request(headers=b"\xff"), "UTF-8", id="request-non-utf8-headers"),
    pytest.param(_request(headers=b"timeout:soon"), "timeout", id="request-bad-timeout"),
    pytest.param(_request(headers=b"timeout:nan"), "timeout", id="request-nan-timeout"),
    pytest.param(_request(headers=b"retry-count:x"), "retry-count", id="request-bad-retry"),
    pytest.param(_request(headers=b"retry-count:1.5"), "retry-count", id="request-float-retry"),
    pytest.param(_request(headers=b"retry-count:-1"), "retry-count", id="request-negative-retry"),
    pytest.param(_request(headers=b"timeout:-3"), "timeout", id="request-negative-timeout"),
    pytest.param(_request(headers=b"run-after:later"), "run-after", id="request-bad-run-after"),
    pytest.param(_request(headers=b"a" * 5000), "too long", id="request-long-headers"),
    pytest.param([b"", P, b"PUBLISH", b"m", b"t"], "PUBLISH needs", id="publish-5"),
    pytest.param([b"", P, b"PUBLISH", b"m", b"", b"x"], "empty queue", id="publish-empty-topic"),
    pytest.param(
        [b"", P, b"SCHEDULE", b"m", b"q", b"", b"60", BODY], "SCHEDULE needs", id="schedule-8"
    ),
    pytest.param(
        [b"", P, b"SCHEDULE", b"m", b"q", b"", b"soon", BODY, b""],
        "interval",
        id="schedule-bad-interval",
    ),
    pytest.param(
        [b"", P, b"SCHEDULE", b"m", b"q", b"", b"-5", BODY, b""],
        "interval",
        id="schedule-negative-interval",
    ),
    pytest.param(
        [b"", P, b"SCHEDULE", b"m", b"q", b"", b"-1", BODY, b""],
        "cron",
        id="schedule-cron-without-expression",
    ),
    pytest.param(
        [b"", P, b"SCHEDULE", b"m", b"q", b"", b"-1", BODY, b"\xff"],
        "UTF-8",
        id="schedule-non-utf8-cron",
    ),
    pytest.param(
        [b"", P, b"SCHEDULE", b"m", b"\xff", b"", BODY], "UTF-8", id="schedule-non-utf8-queue"
    ),
    pytest.param(
        [b"", P, b"UNSCHEDULE", b"m", b"q", b"", b"60", BODY, b"", b"x"],
        "UNSCHEDULE needs",
        id="unschedule-10",
    ),
    pytest.param([b"", P, b"INFORM", b"m", b""], "INFORM needs", id="inform-5"),
    pytest.param(_inform(b"", b"broker"), "peer type", id="inform-unknown-peer-type"),
    pytest.param(_inform(b"", b"\xff"), "UTF-8", id="inform-non-utf8-peer-type"),
    pytest.param(_inform(b"{}"), "queues", id="inform-queues-object"),
    pytest.param(_inform(b"5"), "queues", id="inform-queues-number"),
    pytest.param(_inform(b"[[1, 2, 3]]"), "queue", id="inform-queue-triple"),
    pytest.param(_inform(b'[[true, "x"]]'), "weight", id="inform-bool-weight"),
    pytest.param(_inform(b'[[1.5, "x"]]'), "weight", id="inform-float-weight"),
    pytest.param(_inform(b'[[1, ""]]'), "queue", id="inform-empty-name"),
    pytest.param(_inform(b"email:heavy"), "weight", id="inform-colon-bad-weight"),
    pytest.param(_inform(b"\xff\xfe"), "UTF-8", id="inform-non-utf8-queues"),
    pytest.param(_inform(b'[[1, "' + b"q" * 300 + b'"]]'), "too long", id="inform-long-name"),
    pytest.param(_inform(b"", b"worker", b"{bad"), "meta", id="inform-meta-not-json"),
    pytest.param(_inform(b"", b"worker", b"[1]"), "meta", id="inform-meta-not-object"),
    pytest.param([b"", P, b"HEARTBEAT", b"m", b"nan"], "finite", id="heartbeat-nan"),
    pytest.param([b"", P, b"HEARTBEAT", b"m", b"-inf"], "finite", id="heartbeat-inf"),
    pytest.param([b"", P, b"ERROR", b"m", b"r", b"c"], "ERROR needs", id="error-6"),
    pytest.param([b"", P, b"ERROR", b"m", b"r", b"c", b"\xff"], "UTF-8", id="error-non-utf8"),
]


@pytest.mark.parametrize(("frames", "reason"), MALFORMED)
def test_malformed_message_raises_protocol_error(frames: list[bytes], reason: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode(frames)
    assert reason.lower() in info.value.reason.lower()
    assert str(info.value)  # printable for the log line, frames included


# ---- property: decode never raises anything but ProtocolError ----------------

_COMMANDS = [
    b"ACK",
    b"REPLY",
    b"HEARTBEAT",
    b"DISCONNECT",
    b"KBYE",
    b"KBAI",
    b"REQUEST",
    b"PUBLISH",
    b"SCHEDULE",
    b"UNSCHEDULE",
    b"INFORM",
    b"READY",
    b"ERROR",
]
_INTERESTING = [
    b"",
    P,
    b"worker",
    b"scheduler",
    b"-1",
    b"60",
    b"1e400",
    b"nan",
    b"[]",
    b'[[10, "default"]]',
    b"[40, 'email']",
    b'{"role": "slot"}',
    b"[1]",
    b"reply-requested,retry-count:3",
    b"timeout:x",
    b"retry-count:-1",
    b"ok,ready",
    b"failed,lost",
    b"\xff\xfe",
    b"*/5 * * * *",
    b"a:b,c",
]
_frame = st.one_of(
    st.binary(max_size=48),
    st.sampled_from(_INTERESTING),
    st.sampled_from(_COMMANDS),
    st.text(max_size=24).map(str.encode),
)


@st.composite
def _messages(draw: st.DrawFn) -> list[bytes]:
    if draw(st.booleans()):
        return draw(st.lists(_frame, max_size=12))
    # mostly-valid prefix so that every command decoder is reached
    command = draw(st.sampled_from(_COMMANDS))
    msgid = draw(st.sampled_from([b"m", b"", b"x" * 300]) | st.binary(min_size=1, max_size=8))
    return [b"", P, command, msgid, *draw(st.lists(_frame, max_size=7))]


@settings(max_examples=2000, deadline=None, database=None)
@given(_messages())
def test_decode_returns_a_command_or_raises_protocol_error(frames: list[bytes]) -> None:
    try:
        cmd = decode(frames)
    except ProtocolError as exc:
        assert exc.reason
        return
    # whatever decodes must encode to something that decodes to the same command
    assert decode(cmd.encode()) == cmd


def test_first_attempt_is_added_once_and_never_past_the_length_limit() -> None:
    from emq_django.protocol.headers import MAX_HEADERS_LENGTH, with_first_attempt

    span = b"00-" + b"ab" * 16 + b"-" + b"cd" * 8 + b"-01"
    h = with_first_attempt(parse_headers(b""), span)
    assert h.raw == b"first-attempt:" + span and h.get("first-attempt") == span.decode()
    assert parse_headers(h.raw) == h  # as the worker process parses it
    assert with_first_attempt(h, b"00-" + b"ef" * 16 + b"-" + b"12" * 8 + b"-01") is h
    full = parse_headers(b"task:t,x:" + b"y" * (MAX_HEADERS_LENGTH - 20))
    assert with_first_attempt(full, span) is full
