"""Streamed results on the eMQP side: the PARTIAL codec, the broker core's
handler (counted, forwarded only to a client that asked with ``stream``), the
trace's partial count, and the worker-side run of generator tasks."""

from __future__ import annotations

import json
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from emq_django import streaming
from emq_django.exceptions import ProtocolError
from emq_django.protocol import frames as F
from emq_django.protocol.headers import format_headers, parse_headers
from tests.emqp_machine import BACKEND, FRONTEND
from tests.unit.test_broker_core import (
    P,
    inform,
    make_core,
    ready,
    reply,
    request,
    sent_to,
    take,
    tick,
)

# ---- codec ------------------------------------------------------------------


def test_partial_round_trips_through_the_codec() -> None:
    cmd = F.Partial(b"m1", b'{"value":[1,2]}', b"job-1#2", 7)
    frames = cmd.encode()
    assert frames == [b"", P, b"PARTIAL", b"m1", b'{"value":[1,2]}', b"job-1#2", b"7"]
    assert F.decode(frames) == cmd
    assert (cmd.job_id, cmd.attempt) == (b"job-1", 2)


def test_partial_attempt_id_without_a_number_is_attempt_one() -> None:
    cmd = F.Partial(b"m", b"{}", b"plain-id", 1)
    assert (cmd.job_id, cmd.attempt) == (b"plain-id", 1)


@pytest.mark.parametrize(
    "tail",
    [
        [b"{}", b"j#1"],  # no seq
        [b"{}", b"j#1", b"1", b"x"],  # one frame too many
        [b"{}", b"", b"1"],  # empty attempt id
        [b"{}", b"j" * 256, b"1"],  # attempt id too long
        [b"{}", b"j#1", b"0"],  # seq starts at 1
        [b"{}", b"j#1", b"-1"],
        [b"{}", b"j#1", b"01"],
        [b"{}", b"j#1", b"1e3"],
        [b"{}", b"j#1", b"9" * 10],
        [b"{}", b"j#1", b""],
    ],
)
def test_malformed_partial_is_a_protocol_error(tail: list[bytes]) -> None:
    with pytest.raises(ProtocolError):
        F.decode([b"", P, b"PARTIAL", b"m", *tail])


def test_partial_is_not_awaited_so_a_bad_one_is_never_answered() -> None:
    frames = [b"", P, b"PARTIAL", b"m", b"{}", b"j#1"]
    assert F.answerable_msgid(frames, "backend") is None
    assert F.answerable_msgid(frames, "frontend") is None


def test_stream_header_is_parsed_and_formatted() -> None:
    raw = format_headers(reply_requested=True, task="pkg.t", stream=True)
    assert raw == b"reply-requested,task:pkg.t,stream"
    headers = parse_headers(raw)
    assert headers.stream and headers.reply_requested and headers.extra == ()
    assert not parse_headers(b"reply-requested").stream


# ---- broker core ------------------------------------------------------------


def partial(core, ident: bytes, attempt_id: bytes, seq: int, body: bytes = b'{"value":1}'):  # type: ignore[no-untyped-def]
    core.on_backend(ident, F.Partial(ident + b"-p%d" % seq, body, attempt_id, seq).encode(), 0.0)
    return take(core)


def running(headers: bytes) -> object:
    core = make_core()
    inform(core, b"w")
    ready(core, b"w")
    request(core, b"client", b"j1", headers=headers)
    return core


def test_partial_is_forwarded_to_a_client_that_asked_for_it() -> None:
    core = running(b"reply-requested,stream")
    out = partial(core, b"w", b"j1#1", 1, b'{"value":"a"}')
    forwarded = sent_to(out, FRONTEND, b"client")
    assert [(type(c), c.body, c.attempt_id, c.seq) for c in forwarded] == [
        (F.Partial, b'{"value":"a"}', b"j1#1", 1)
    ]
    assert core.counters["partials"] == 1 and core.counters["partials_forwarded"] == 1  # type: ignore[attr-defined]
    assert core.inflight[b"j1#1"].partials == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("headers", [b"", b"reply-requested", b"stream"])
def test_partial_is_counted_but_not_forwarded_unless_streaming_was_asked(headers: bytes) -> None:
    """An EventMQ client (no ``stream`` header) never receives a PARTIAL."""
    core = running(headers)
    out = partial(core, b"w", b"j1#1", 1)
    assert [f for s, _, f in out if s == FRONTEND] == []
    assert core.counters["partials"] == 1 and core.counters["partials_forwarded"] == 0  # type: ignore[attr-defined]


def test_partial_of_no_attempt_in_flight_is_stale() -> None:
    core = running(b"reply-requested,stream")
    inform(core, b"other")
    assert partial(core, b"w", b"nope#1", 1) == []
    assert partial(core, b"other", b"j1#1", 1) == []  # not the peer running it
    assert core.counters["stale_partials"] == 2 and core.counters["partials"] == 0  # type: ignore[attr-defined]


def test_partial_from_an_unknown_peer_is_dropped() -> None:
    core = running(b"reply-requested,stream")
    assert partial(core, b"stranger", b"j1#1", 1) == []
    assert core.counters["unknown_peer"] == 1  # type: ignore[attr-defined]


def test_partial_on_the_client_port_is_dropped_unanswered() -> None:
    core = make_core()
    core.on_frontend(b"c", F.Partial(b"m", b"{}", b"j#1", 1).encode(), 0.0)
    assert take(core) == []
    assert core.counters["dropped_malformed"] == 1


def test_partials_then_reply_reach_the_client_in_order_and_the_trace_counts_them() -> None:
    core = running(b"reply-requested,stream,task:pkg.gen")
    core.trace = []  # type: ignore[attr-defined]
    out = []
    for seq in (1, 2, 3):
        out += partial(core, b"w", b"j1#1", seq)
    out += reply(core, b"w", b"j1#1")
    kinds = [type(c).__name__ for c in sent_to(out, FRONTEND, b"client")]
    assert kinds == ["Partial", "Partial", "Partial", "Reply"]
    lines = [json.loads(line) for line in core.trace]  # type: ignore[attr-defined]
    assert lines[-1]["event"] == "succeeded" and lines[-1]["partials"] == 3


def test_failed_attempt_line_counts_its_partials_and_a_retry_starts_from_zero() -> None:
    core = running(b"reply-requested,stream,retry-count:1")
    core.trace = []  # type: ignore[attr-defined]
    partial(core, b"w", b"j1#1", 1)
    partial(core, b"w", b"j1#1", 2)
    reply(core, b"w", b"j1#1", status=b"failed,ready,error:ValueError")
    retried = json.loads(core.trace[-1])  # type: ignore[attr-defined]
    assert retried["event"] == "retried" and retried["partials"] == 2
    tick(core, 10.0, keep_alive=(b"w",))  # the retry is due
    assert core.inflight[b"j1#2"].partials == 0  # type: ignore[attr-defined]
    out = partial(core, b"w", b"j1#2", 1)
    assert [c.attempt_id for c in sent_to(out, FRONTEND, b"client")] == [b"j1#2"]
    reply(core, b"w", b"j1#2", now=10.0)
    done = json.loads(core.trace[-1])  # type: ignore[attr-defined]
    assert done["event"] == "succeeded" and done["attempt"] == 2 and done["partials"] == 1


def test_no_partial_ever_goes_to_the_backend() -> None:
    core = running(b"reply-requested,stream")
    out = partial(core, b"w", b"j1#1", 1)
    assert [f for s, _, f in out if s == BACKEND] == []


# ---- running generator tasks --------------------------------------------------


def test_run_task_sends_each_yielded_value_and_returns_the_generator_return() -> None:
    got: list[bytes] = []

    def gen(n: int) -> Generator[int, None, str]:
        yield from range(n)
        return "end"

    token = streaming.partial_sink.set(got.append)
    try:
        assert streaming.run_task(gen, [3], {}) == "end"
    finally:
        streaming.partial_sink.reset(token)
    assert got == [b'{"value":0}', b'{"value":1}', b'{"value":2}']


def test_partial_outside_a_job_does_nothing_and_rejects_what_json_cannot_carry() -> None:
    streaming.partial({"a": 1})  # no sink: nothing happens
    token = streaming.partial_sink.set(lambda body: None)
    try:
        with pytest.raises(TypeError, match="JSON serializable"):
            streaming.partial(object())
    finally:
        streaming.partial_sink.reset(token)


def test_a_failing_generator_raises_after_its_partials() -> None:
    got: list[bytes] = []

    def gen() -> Iterator[int]:
        yield 1
        raise ValueError("after one")

    token = streaming.partial_sink.set(got.append)
    try:
        with pytest.raises(ValueError, match="after one"):
            streaming.run_task(gen, [], {})
    finally:
        streaming.partial_sink.reset(token)
    assert got == [b'{"value":1}']


# ---- the client's bookkeeping (no socket: messages handed to it directly) ---------


def _client_with(messages: list[list[bytes]]) -> Any:
    from emq_django.client import Client

    client = Client("tcp://127.0.0.1:1")
    for frames in messages:
        client._handle(frames)
    return client


def _partial_frames(job: bytes, seq: int, value: Any, attempt: int = 1) -> list[bytes]:
    body = json.dumps({"value": value}).encode()
    return F.Partial(b"m%d" % seq, body, job + b"#%d" % attempt, seq).encode()


def _reply_frames(job: bytes, value: Any) -> list[bytes]:
    return F.Reply(b"r", json.dumps({"value": value}).encode(), job, b"ok").encode()


def test_stream_yields_partials_in_order_then_the_final_value() -> None:
    from emq_django.handles import Result

    client = _client_with(
        [_partial_frames(b"j", 1, "a"), _partial_frames(b"j", 2, "b"), _reply_frames(b"j", 9)]
    )
    result = Result("j", "t", client=client)
    assert list(result.stream(timeout=1)) == ["a", "b", 9]
    assert result.get() == 9 and list(result.stream()) == [9]
    assert not client._partials


def test_get_drops_the_partials_nobody_streamed() -> None:
    from emq_django.handles import Result

    client = _client_with([_partial_frames(b"j", 1, "a"), _reply_frames(b"j", 1)])
    assert Result("j", "t", client=client).get(timeout=1) == 1
    assert not client._partials


def test_a_job_keeps_at_most_max_partials_and_the_stream_sees_the_gap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from emq_django.client import inbox as client_module
    from emq_django.exceptions import PartialsLost
    from emq_django.handles import Result

    monkeypatch.setattr(client_module, "MAX_PARTIALS_PER_JOB", 2)
    client = _client_with([_partial_frames(b"j", n, n) for n in (1, 2, 3)])
    assert len(client._partials[b"j"].items) == 2
    with pytest.raises(PartialsLost, match="1 partial results"):
        list(Result("j", "t", client=client).stream(timeout=1))


def test_only_max_streamed_jobs_keep_partials(monkeypatch: pytest.MonkeyPatch) -> None:
    from emq_django.client import inbox as client_module
    from emq_django.exceptions import PartialsLost
    from emq_django.handles import Result

    monkeypatch.setattr(client_module, "MAX_STREAMED_JOBS", 2)
    client = _client_with([_partial_frames(job, 1, "x") for job in (b"a", b"b", b"c")])
    assert list(client._partials) == [b"b", b"c"]
    with pytest.raises(PartialsLost):
        list(Result("a", "t", client=client).stream(timeout=1))


def test_a_retry_restarts_the_stream_and_drops_late_partials_of_the_old_attempt() -> None:
    from emq_django.handles import Result

    client = _client_with(
        [
            _partial_frames(b"j", 1, "a1", attempt=1),
            _partial_frames(b"j", 1, "b1", attempt=2),
            _partial_frames(b"j", 2, "late", attempt=1),
            _partial_frames(b"j", 2, "b2", attempt=2),
            _reply_frames(b"j", "ok"),
        ]
    )
    result = Result("j", "t", client=client)
    seen = [(value, result.attempt) for value in result.stream(timeout=1)]
    assert seen == [("a1", 1), ("b1", 2), ("b2", 2), ("ok", 2)]


# ---- the history record -------------------------------------------------------


def test_record_batch_carries_the_partial_count_and_reads_old_rows() -> None:
    from emq_django.worker.recorder_process import RecordBatch, decode_batch

    batch = RecordBatch("jm")
    batch.add(b"j#1", "t", "q", 1, 2, False, "", 0, b"[]", b'{"value":1}', partials=5)
    batch.add(b"k#1", "t", "q", 1, 2, False, "", 0, b"[]", b'{"value":1}')
    header, blob = batch.encode()
    assert [r.partials for r in decode_batch([header, blob])] == [5, 0]
    doc = json.loads(header)
    doc["rows"] = [row[:11] for row in doc["rows"]]  # a worker from before streaming
    old = decode_batch([json.dumps(doc).encode(), blob])
    assert [r.partials for r in old] == [0, 0]
    doc["rows"][0].append(-1)
    with pytest.raises(ValueError):
        decode_batch([json.dumps(doc).encode(), blob])
