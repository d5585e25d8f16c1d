"""Every refusal is answered (issue 12, item 4): within a second, either an exception
at the call site or ``JobRefused`` with the broker's reason; never a timeout.

Bad options are refused by the client before anything is sent; bad headers that a
foreign client puts on the wire get an ERROR from a real broker process, and a too
deep body that reaches a worker fails the attempt without killing the worker.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from emq_django.exceptions import JobRefused, TaskFailed
from emq_django.monitor_client import status
from emq_django.protocol import frames as F
from emq_django.protocol.frames import PROTOCOL, decode
from emq_django.protocol.limits import MAX_DEPTH
from tests.e2e import spine_tasks as tasks
from tests.e2e.test_spine import start_jm, wait_jm_ready
from tests.support import EmqProcesses, ManagedProcess, start_broker, wait_until

pytestmark = pytest.mark.e2e

ANSWER_WITHIN = 1.0  # seconds: the done-when line of issue 12
BODY = b'["run", {"callable": "add", "path": "tests.e2e.spine_tasks", "args": [1, 2]}]'


def deep(n: int) -> Any:
    value: Any = 1
    for _ in range(n):
        value = [value]
    return value


# ---- the client refuses bad options at the call site ---------------------------

BAD_OPTIONS = [
    pytest.param({"timeout": -1}, ValueError, id="timeout-negative"),
    pytest.param({"timeout": math.nan}, ValueError, id="timeout-nan"),
    pytest.param({"timeout": math.inf}, ValueError, id="timeout-inf"),
    pytest.param({"timeout": "30"}, TypeError, id="timeout-str"),
    pytest.param({"retries": -1}, ValueError, id="retries-negative"),
    pytest.param({"retries": 1.5}, TypeError, id="retries-float"),
    pytest.param({"retries": "abc"}, TypeError, id="retries-str"),
    pytest.param({"retries": 2**31}, ValueError, id="retries-2-to-the-31"),
    pytest.param({"timeout": 1e308}, ValueError, id="timeout-1e308"),
    pytest.param({"queue": ""}, ValueError, id="queue-empty"),
    pytest.param({"queue": "q" * 256}, ValueError, id="queue-256-bytes"),
    pytest.param({"queue": "é" * 128}, ValueError, id="queue-256-utf8-bytes"),
    pytest.param({"queue": "a,b"}, ValueError, id="queue-comma"),
    pytest.param({"queue": "a:b"}, ValueError, id="queue-colon"),
    pytest.param({"queue": "a b"}, ValueError, id="queue-space"),
    pytest.param({"queue": "a\nb"}, ValueError, id="queue-control"),
    pytest.param({"queue": 7}, TypeError, id="queue-int"),
    pytest.param({"countdown": -1}, ValueError, id="countdown-negative"),
    pytest.param({"countdown": math.inf}, ValueError, id="countdown-inf"),
    pytest.param({"countdown": math.nan}, ValueError, id="countdown-nan"),
    pytest.param({"countdown": 1e308}, ValueError, id="countdown-1e308"),
    pytest.param({"countdown": 400 * 86400}, ValueError, id="countdown-over-a-year"),
    pytest.param({"eta": dt.datetime(9999, 1, 1, tzinfo=dt.UTC)}, ValueError, id="eta-year-9999"),
    pytest.param({"eta": 12.0}, TypeError, id="eta-number"),
    pytest.param({"guarantee": "yes"}, TypeError, id="guarantee-str"),
    pytest.param({"job_id": ""}, ValueError, id="job-id-empty"),
    pytest.param({"job_id": "a#1"}, ValueError, id="job-id-hash"),
    pytest.param({"soft_timeout": -1}, ValueError, id="soft-timeout-negative"),
    pytest.param({"soft_timeout": "1"}, TypeError, id="soft-timeout-str"),
    pytest.param({"soft_timeout": 5, "timeout": 5}, ValueError, id="soft-timeout-not-under-hard"),
    pytest.param({"job_id": "é" * 150}, ValueError, id="job-id-300-utf8-bytes"),
]


@pytest.mark.parametrize(("options", "error"), BAD_OPTIONS)
def test_bad_option_raises_at_the_call_site(
    options: dict[str, Any], error: type[Exception], emq_client_env: dict[str, str]
) -> None:
    # no broker runs: the check comes before any send, so nothing waits
    start = time.monotonic()
    with pytest.raises(error):
        tasks.add.apply_async((1, 2), **options)
    assert time.monotonic() - start < ANSWER_WITHIN


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 985, 10_000])
def test_too_deep_arguments_raise_type_error(depth: int, emq_client_env: dict[str, str]) -> None:
    with pytest.raises(TypeError, match=f"more than {MAX_DEPTH} deep"):
        tasks.add.delay(deep(depth), 1)
    with pytest.raises(TypeError, match=f"more than {MAX_DEPTH} deep"):
        tasks.add.apply_async((), {"x": deep(depth), "y": 1})
    with pytest.raises(TypeError, match=f"more than {MAX_DEPTH} deep"):
        tasks.add.map([(1, 2), (deep(depth), 1)])


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [("abc", None), (b"ab", None), ({"x": 1}, None), (5, None), ((), [1]), ((), "x=1")],
    ids=["args-str", "args-bytes", "args-dict", "args-int", "kwargs-list", "kwargs-str"],
)
def test_args_and_kwargs_of_the_wrong_kind_raise_type_error(
    args: Any, kwargs: Any, emq_client_env: dict[str, str]
) -> None:
    with pytest.raises(TypeError, match="args of .* must be a"):
        tasks.add.apply_async(args, kwargs)


def test_a_lone_surrogate_in_the_arguments_raises_type_error(
    emq_client_env: dict[str, str],
) -> None:
    for call in (
        lambda: tasks.add.delay("a\ud800", ""),
        lambda: tasks.add.apply_async((1,), {"y": "\udcff"}),
        lambda: tasks.add.map([("a\ud800", "")]),
    ):
        with pytest.raises(TypeError, match="lone surrogate"):
            call()


def test_arguments_at_the_depth_limit_are_accepted(emq_client_env: dict[str, str]) -> None:
    from emq_django.protocol.body import decode_run_body, encode_run_body

    body = encode_run_body("m", "f", [deep(MAX_DEPTH)], {"k": deep(MAX_DEPTH)})
    assert decode_run_body(body).args == [deep(MAX_DEPTH)]


def test_task_declared_with_bad_options_is_refused() -> None:
    import emq_django as emq

    for options in (
        {"retries": -1},
        {"retries": 2**31},
        {"timeout": math.inf},
        {"timeout": 1e308},
        {"queue": "x" * 300},
        {"soft_timeout": 2, "timeout": 1},
    ):
        with pytest.raises((ValueError, TypeError)):
            emq.task(**options)(tasks.add.fn)


# ---- the broker answers bad headers from a foreign client -----------------------


@pytest.fixture
def broker(emq_processes: EmqProcesses, emq_env: dict[str, str]) -> Iterator[ManagedProcess]:
    yield start_broker(emq_processes, emq_env, extra_env={"EMQ_MAX_BODY_BYTES": "4096"})


@pytest.fixture
def dealer(emq_env: dict[str, str], broker: ManagedProcess) -> Iterator[zmq.Socket[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(emq_env["EMQ_FRONTEND_BIND"])
    yield sock
    sock.close(linger=0)
    context.destroy(linger=0)


def answer_to(sock: zmq.Socket[Any], msgid: bytes, within: float = ANSWER_WITHIN) -> F.Command:
    """The broker's ACK or ERROR for ``msgid``, which must come within ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"no answer to {msgid!r} within {within} s"
        if sock.poll(int(left * 1000) + 1):
            cmd = decode(sock.recv_multipart())
            if isinstance(cmd, F.Ack) and cmd.ack_msgid == msgid:
                return cmd
            if isinstance(cmd, F.Error) and cmd.ref_msgid == msgid:
                return cmd


def far(seconds: float) -> bytes:
    return b"%.6f" % (time.time() + seconds)


BAD_WIRE = [
    pytest.param(b"q", b"timeout:-1", BODY, "bad-header", id="timeout-negative"),
    pytest.param(b"q", b"timeout:inf", BODY, "bad-header", id="timeout-inf"),
    pytest.param(b"q", b"retry-count:abc", BODY, "bad-header", id="retry-count-abc"),
    pytest.param(b"q", b"retry-count:-1", BODY, "bad-header", id="retry-count-negative"),
    pytest.param(b"q", b"retry-count:2147483648", BODY, "bad-header", id="retry-count-2-to-the-31"),
    pytest.param(b"q", b"timeout:1e308", BODY, "bad-header", id="timeout-1e308"),
    pytest.param(b"q", b"run-after:nan", BODY, "bad-run-after", id="run-after-nan"),
    pytest.param(b"q", b"run-after:inf", BODY, "bad-run-after", id="run-after-inf"),
    pytest.param(b"q", b"run-after:-5", BODY, "bad-run-after", id="run-after-negative"),
    pytest.param(b"q", b"run-after:1e308", BODY, "bad-run-after", id="run-after-1e308"),
    pytest.param(b"q", b"run-after:" + far(2 * 366 * 86400), BODY, "bad-run-after", id="2-years"),
    pytest.param(b"q", b"\xff\xfe", BODY, "bad-header", id="headers-not-utf8"),
    pytest.param(b"q" * 256, b"", BODY, "queue-name-too-long", id="queue-256"),
    pytest.param(b"", b"", BODY, "bad-queue-name", id="queue-empty"),
    pytest.param(b"\xff", b"", BODY, "bad-queue-name", id="queue-not-utf8"),
    pytest.param(b"a b", b"", BODY, "bad-queue-name", id="queue-space"),
    pytest.param(b"a\tb", b"", BODY, "bad-queue-name", id="queue-tab"),
    pytest.param(b"a,b", b"", BODY, "bad-queue-name", id="queue-comma"),
    pytest.param(b"a:b", b"", BODY, "bad-queue-name", id="queue-colon"),
    pytest.param(b"a\x01b", b"", BODY, "bad-queue-name", id="queue-control"),
    pytest.param(b"q", b"", b"x" * 5000, "body-too-big", id="body-over-limit"),
]


@pytest.mark.parametrize(("queue", "headers", "body", "code"), BAD_WIRE)
def test_bad_request_on_the_wire_gets_an_error_within_a_second(
    queue: bytes,
    headers: bytes,
    body: bytes,
    code: str,
    dealer: zmq.Socket[Any],
    emq_env: dict[str, str],
) -> None:
    msgid = uuid.uuid4().hex.encode()
    dealer.send_multipart([b"", PROTOCOL, F.REQUEST, msgid, queue, headers, body])
    answer = answer_to(dealer, msgid)
    assert isinstance(answer, F.Error), answer
    assert answer.code == code and answer.reason
    counters = status(emq_env["EMQ_MONITOR_URL"], timeout=2.0)["counters"]
    assert counters["refused_" + code.replace("-", "_")] == 1
    assert counters["refused"] == 1
    # and the broker still serves: a good request right after is ACKed
    good = uuid.uuid4().hex.encode()
    dealer.send_multipart([b"", PROTOCOL, F.REQUEST, good, b"q", b"", BODY])
    assert isinstance(answer_to(dealer, good), F.Ack)


def test_job_id_is_measured_in_bytes(emq_client_env: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="300 bytes of UTF-8 \\(150 characters\\)"):
        tasks.add.apply_async((1, 2), job_id="é" * 150)
    with pytest.raises(ValueError, match="job_id") as caught:
        tasks.add.apply_async((1, 2), job_id="a\ud800")
    assert type(caught.value) is ValueError  # not a UnicodeEncodeError from deep inside


def test_an_over_long_msgid_gets_an_error_naming_it(
    dealer: zmq.Socket[Any], emq_env: dict[str, str]
) -> None:
    msgid = "é".encode() * 150  # a client that counted characters: 300 bytes
    dealer.send_multipart([b"", PROTOCOL, F.REQUEST, msgid, b"q", b"", BODY])
    answer = answer_to(dealer, msgid)
    assert isinstance(answer, F.Error), answer
    assert answer.code == "malformed" and "300 bytes" in answer.reason


def test_a_schedule_for_a_queue_no_job_manager_can_serve_is_refused(
    dealer: zmq.Socket[Any],
) -> None:
    msgid = uuid.uuid4().hex.encode()
    dealer.send_multipart([b"", PROTOCOL, F.SCHEDULE, msgid, b"a,b", b"", b"60", BODY, b""])
    answer = answer_to(dealer, msgid)
    assert isinstance(answer, F.Error), answer
    assert answer.code == "bad-queue-name" and "','" in answer.reason


@pytest.mark.parametrize("port", ["EMQ_FRONTEND_BIND", "EMQ_BACKEND_BIND"])
def test_an_inform_whose_queues_nest_deep_gets_an_error(
    port: str, broker: ManagedProcess, emq_env: dict[str, str]
) -> None:
    """``[`` nested 5,000 deep used to be a RecursionError inside the broker (an
    internal error, no answer) on both ports (issue 29, item 16)."""
    context: zmq.Context[Any] = zmq.Context()
    sock = context.socket(zmq.DEALER)
    try:
        sock.connect(emq_env[port])
        for peer_type, queues in ((b"worker", b"[" * 5000), (b"scheduler", b"[" * 5000 + b"]")):
            msgid = uuid.uuid4().hex.encode()
            sock.send_multipart([b"", PROTOCOL, F.INFORM, msgid, queues, peer_type])
            answer = answer_to(sock, msgid)
            assert isinstance(answer, F.Error), answer
            assert answer.code in ("malformed", "wrong-port"), answer
        msgid = uuid.uuid4().hex.encode()
        meta = b'{"a":' + b"[" * 5000
        sock.send_multipart([b"", PROTOCOL, F.INFORM, msgid, b"", b"worker", meta])
        assert isinstance(answer_to(sock, msgid), F.Error)
        counters = status(emq_env["EMQ_MONITOR_URL"], timeout=2.0)["counters"]
        assert counters["internal_errors"] == 0, counters
    finally:
        sock.close(linger=0)
        context.destroy(linger=0)


def test_a_schedule_whose_interval_is_past_ten_years_is_refused(dealer: zmq.Socket[Any]) -> None:
    msgid = uuid.uuid4().hex.encode()
    interval = b"1" + b"0" * 20
    dealer.send_multipart([b"", PROTOCOL, F.SCHEDULE, msgid, b"q", b"", interval, BODY, b""])
    answer = answer_to(dealer, msgid)
    assert isinstance(answer, F.Error), answer
    assert answer.code == "malformed" and "the most is" in answer.reason


def test_run_after_within_a_year_is_accepted(dealer: zmq.Socket[Any]) -> None:
    msgid = uuid.uuid4().hex.encode()
    headers = b"run-after:" + far(300 * 86400)
    dealer.send_multipart([b"", PROTOCOL, F.REQUEST, msgid, b"q", headers, BODY])
    assert isinstance(answer_to(dealer, msgid), F.Ack)


def test_other_refused_commands_are_answered_and_broken_frames_counted(
    dealer: zmq.Socket[Any], emq_env: dict[str, str]
) -> None:
    dealer.send_multipart([b"", PROTOCOL, b"NOPE", b"m1"])
    dealer.send_multipart([b"", PROTOCOL, F.REQUEST, b"m2", b"q"])  # 5 frames
    dealer.send_multipart([b"", PROTOCOL, F.SCHEDULE, b"m3", b"q", b"", b"-7", BODY, b""])
    dealer.send_multipart([b"", PROTOCOL, F.INFORM, b"m4", b"", b"worker"])  # wrong port
    codes = {m: answer_to(dealer, m) for m in (b"m1", b"m2", b"m3", b"m4")}
    assert {m: getattr(c, "code", None) for m, c in codes.items()} == {
        b"m1": "unknown-command",
        b"m2": "malformed",
        b"m3": "malformed",
        b"m4": "wrong-port",
    }
    dealer.send_multipart([b"junk"])  # no msgid to answer: a counted drop
    dealer.send_multipart([b"", PROTOCOL, F.REQUEST, b"", b"q", b"", BODY])
    counters = wait_until(
        lambda: (
            (c := status(emq_env["EMQ_MONITOR_URL"], timeout=2.0)["counters"])["dropped_malformed"]
            >= 2
            and c
        ),
        "the two broken frames counted",
        10,
    )
    assert counters["dropped_malformed"] == 2
    assert counters["protocol_errors"] == 6
    assert counters["refused"] == 4


# ---- JobRefused, never a timeout ---------------------------------------------------


def test_refused_job_raises_job_refused_from_delay_and_get(
    emq_processes: EmqProcesses, emq_env: dict[str, str], emq_client_env: dict[str, str]
) -> None:
    # the broker takes at most 4096-byte bodies; this client believes 64 MiB
    start_broker(emq_processes, emq_env, extra_env={"EMQ_MAX_BODY_BYTES": "4096"})
    big = "x" * 5000
    start = time.monotonic()
    with pytest.raises(JobRefused, match="4096"):  # the socket's first message waits
        tasks.add.delay(big, "")
    assert time.monotonic() - start < ANSWER_WITHIN
    assert tasks.add.delay(1, 2).id  # pipelined from here on
    result = tasks.add.delay(big, "")  # not waited for: the refusal comes to get()
    start = time.monotonic()
    with pytest.raises(JobRefused, match="body is 50"):
        result.get(timeout=10)
    assert time.monotonic() - start < ANSWER_WITHIN
    with pytest.raises(JobRefused, match="4096"):  # guaranteed: waits for the ACK
        tasks.add.apply_async((big, ""), guarantee=True)
    results = tasks.add.map([(1, 2), (big, "")])  # one refused, the other runs
    with pytest.raises(JobRefused, match="4096"):
        results[1].get(timeout=10)


# ---- a too deep body that bypassed the client fails the attempt, not the worker ----


def test_worker_fails_a_too_deep_body_and_keeps_running(
    emq_processes: EmqProcesses, emq_env: dict[str, str], emq_client_env: dict[str, str]
) -> None:
    start_broker(emq_processes, emq_env)
    jm = start_jm(emq_processes, "D", concurrency=1)
    wait_jm_ready(emq_env, "D", 1, procs=[jm])
    context: zmq.Context[Any] = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(emq_env["EMQ_FRONTEND_BIND"])
    try:
        for depth in (985, 5000):
            args = "[" * depth + "1" + "]" * depth  # one argument, ``depth`` deep
            body = (
                '["run", {"callable": "add", "path": "tests.e2e.spine_tasks", "args": '
                + args
                + ', "kwargs": {}}]'
            ).encode()
            msgid = b"deep-%d" % depth
            sock.send_multipart(
                [b"", PROTOCOL, F.REQUEST, msgid, b"spine", b"reply-requested", body]
            )
            reply = None
            deadline = time.monotonic() + 10
            while reply is None and time.monotonic() < deadline:
                if sock.poll(500):
                    cmd = decode(sock.recv_multipart())
                    if isinstance(cmd, F.Reply) and cmd.request_msgid == msgid:
                        reply = cmd
            assert reply is not None, f"no REPLY for the {depth}-deep body"
            assert reply.failed
            error = json.loads(reply.body)["error"]
            assert error["type"].endswith("ProtocolError")
            assert f"more than {MAX_DEPTH} deep" in error["message"]
    finally:
        sock.close(linger=0)
        context.destroy(linger=0)
    # the same single worker process still runs jobs
    assert tasks.add.delay(2, 3).get(timeout=10) == 5
    assert jm.alive()
    assert "RecursionError" not in jm.stderr()
    with pytest.raises(TaskFailed):
        tasks.boom.delay("still a normal failure").get(timeout=10)


# ---- map() without a broker names every job, and resend() reuses the ids ------------


def test_map_without_a_broker_names_every_job_it_could_not_send(
    emq_client_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from emq_django.client import reset_client
    from emq_django.conf import reset_cached_settings
    from emq_django.exceptions import BatchUnacknowledged, BrokerUnavailable

    monkeypatch.setenv("EMQ_ACK_TIMEOUT", "0.5")
    reset_cached_settings()
    reset_client()
    with pytest.raises(BatchUnacknowledged) as info:
        tasks.add.map([(n, n) for n in range(5)])
    error = info.value
    assert isinstance(error, BrokerUnavailable)
    assert error.job_ids == [r.id for r in error.results] and len(error.job_ids) == 5
    with pytest.raises(BatchUnacknowledged) as again:
        error.resend()
    assert again.value.job_ids == error.job_ids  # the same ids, not new ones


# ---- refusals of jobs sent without reply reach the application -----------------------


def test_refusals_of_jobs_sent_without_reply_are_raised_by_the_next_call(
    emq_processes: EmqProcesses, emq_env: dict[str, str], emq_client_env: dict[str, str]
) -> None:
    """Issue 29 item 11: nobody calls get() on a reply=False job, so its refusal
    (here QueueFull: the queue holds 10 and nobody serves it) is raised by the
    client's next call, naming the jobs refused."""
    from emq_django.client import get_client
    from emq_django.exceptions import JobsRefused

    start_broker(emq_processes, emq_env, extra_env={"EMQ_MAX_PENDING": "10"})
    sent = [tasks.forget.delay(n).id for n in range(40)]
    with pytest.raises(JobsRefused) as refused:
        get_client().flush(timeout=10)  # waits for every answer: 10 ACKs, 30 refusals
    assert refused.value.job_ids == sent[10:]
    assert refused.value.codes == {"queue-full"}
    assert "30 jobs sent without reply" in str(refused.value)
    # a sender that never flushes learns it from a later delay(), whose job is not sent
    later = []
    with pytest.raises(JobsRefused) as refused:
        for n in range(5000):  # the client reads its answers at least every 1000 jobs
            later.append(tasks.forget.delay(n).id)
    assert refused.value.job_ids == later[: len(refused.value.job_ids)]
    assert "this call's job was not sent" in str(refused.value)
