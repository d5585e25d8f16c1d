"""Flow control (issue 33): the token bucket on a clock the test moves, the checks
of rates, ``max_concurrency`` and keys at the call site and on the wire, and the
core holding jobs back at dispatch (typed commands in, typed effects out, fake
``now``). The real processes' tests are tests/e2e/test_flow_control.py."""

from __future__ import annotations

import pytest

from emq_django.broker.core import BrokerConfig
from emq_django.broker.effects import OK_READY, Deliver, Effect
from emq_django.broker.flow import BURST, TokenBucket
from emq_django.broker.monitor import queues
from emq_django.exceptions import ProtocolError
from emq_django.flow_control import with_concurrency_key
from emq_django.protocol import PROTOCOL, Error, decode
from emq_django.protocol.flow import (
    check_concurrency_key,
    check_max_concurrency,
    parse_queue_rates,
    parse_rate,
)
from emq_django.protocol.headers import format_headers, parse_headers
from emq_django.task import task
from tests.emqp_machine import EmqpMachine
from tests.support.core_harness import CoreHarness
from tests.unit.test_broker_core import INTERVAL, LIVENESS

SLOT = {"role": "slot", "manager": "jm", "incarnation": "1", "slot": 0}

# ---- the token bucket ---------------------------------------------------------------


def test_a_bucket_starts_full_and_spaces_its_tokens_one_over_the_rate() -> None:
    bucket = TokenBucket(rate=20.0, now=100.0)
    assert bucket.ready(100.0)
    bucket.take(100.0)
    assert not bucket.ready(100.0)
    assert bucket.next_token(100.0) == pytest.approx(100.05)
    assert not bucket.ready(100.049)
    assert bucket.ready(100.05)


def test_a_bucket_never_holds_more_than_its_burst() -> None:
    bucket = TokenBucket(rate=10.0, now=0.0)
    taken = 0
    while bucket.ready(3600.0):  # an hour idle
        bucket.take(3600.0)
        taken += 1
    assert taken == BURST == 1


def test_in_any_window_a_bucket_gives_at_most_burst_plus_rate_times_its_length() -> None:
    bucket = TokenBucket(rate=20.0, now=0.0)
    given = []
    now = 0.0
    while now < 10.0:  # asked every millisecond
        if bucket.ready(now):
            bucket.take(now)
            given.append(now)
        now = round(now + 0.001, 6)
    most = max(sum(1 for t in given if start <= t < start + 1.0) for start in given)
    assert most <= BURST + 20
    assert len(given) >= 200  # ... and it keeps its rate: 1 + 20 * 9.999


def test_a_new_rate_keeps_the_tokens_earned_so_far() -> None:
    bucket = TokenBucket(rate=1.0, now=0.0)
    bucket.take(0.0)
    bucket.set_rate(10.0, 0.5)  # half a token by now
    assert not bucket.ready(0.5)
    assert bucket.next_token(0.5) == pytest.approx(0.55)


# ---- the checks -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "per_second"), [("100/s", 100.0), ("6/m", 0.1), ("7200/h", 2.0), (" 2.5/s", 2.5)]
)
def test_a_rate_is_a_number_per_second_minute_or_hour(text: str, per_second: float) -> None:
    assert parse_rate(text) == pytest.approx(per_second)


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ("abc", ValueError),
        ("0/s", ValueError),
        ("-5/s", ValueError),
        ("5/d", ValueError),
        ("5", ValueError),
        ("nan/s", ValueError),
        ("inf/s", ValueError),
        ("", ValueError),
        ("2000000/s", ValueError),
        (5, TypeError),
        (None, TypeError),
    ],
)
def test_a_bad_rate_is_refused(bad: object, error: type) -> None:
    with pytest.raises(error, match="rate_limit"):
        parse_rate(bad)


@pytest.mark.parametrize(
    ("bad", "error"), [(-1, ValueError), (0, ValueError), ("2", TypeError), (True, TypeError)]
)
def test_max_concurrency_is_an_int_from_one(bad: object, error: type) -> None:
    with pytest.raises(error, match="max_concurrency"):
        check_max_concurrency(bad)


@pytest.mark.parametrize(
    ("bad", "error"),
    [("", ValueError), ("a,b", ValueError), ("k" * 201, ValueError), (7, TypeError)],
)
def test_a_bad_concurrency_key_is_refused(bad: object, error: type) -> None:
    with pytest.raises(error, match="concurrency_key"):
        check_concurrency_key(bad)


def test_queue_rates_are_checked_as_the_setting_gives_them() -> None:
    assert parse_queue_rates('{"email": "10/s"}') == {"email": 10.0}
    assert parse_queue_rates({}) == {}
    with pytest.raises(ValueError, match="'email'"):
        parse_queue_rates({"email": "0/s"})
    with pytest.raises(TypeError):
        parse_queue_rates(["email"])


@pytest.mark.parametrize(
    "options",
    [
        {"rate_limit": "abc"},
        {"rate_limit": "0/s"},
        {"rate_limit": 10},
        {"max_concurrency": -1},
        {"max_concurrency": 2.0},
        {"max_concurrency": 1, "concurrency_key": ""},
        {"concurrency_key": "customer-42"},  # a key with no limit per key
    ],
)
def test_the_task_refuses_bad_flow_options_where_they_are_declared(options: object) -> None:
    with pytest.raises((TypeError, ValueError)):
        task(**options)(len)  # type: ignore[call-overload]


def test_the_task_sends_its_limits_and_each_call_its_key() -> None:
    limited = task(rate_limit="20/s", max_concurrency=2)(len)
    headers = parse_headers(limited._headers)
    assert (headers.rate_limit, headers.max_concurrency, headers.flow) == (20.0, 2, True)
    keyed = parse_headers(with_concurrency_key(limited._headers, "customer-42"))
    assert keyed.concurrency_key == "customer-42"
    with pytest.raises(ValueError, match="concurrency_key"):
        limited.flow.key_for("", (), None)
    derived = task(max_concurrency=1, concurrency_key=lambda customer, **_: f"c-{customer}")(len)
    assert derived.flow.key_for(None, (42,), {}) == "c-42"
    with pytest.raises(ValueError, match="max_concurrency"):
        task()(len).flow.key_for("customer-42", (), None)


# ---- the wire -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"rate-limit:abc", "rate-limit"),
        (b"rate-limit:0/s", "more than 0"),
        (b"max-concurrency:-1", "max-concurrency"),
        (b"max-concurrency:x", "must be an integer"),
        (b"max-concurrency:0", "from 1"),
        (b"max-concurrency:1,concurrency-key:", "must not be empty"),
        (b"concurrency-key:a", "needs a 'max-concurrency'"),
    ],
)
def test_a_bad_flow_header_is_refused_with_a_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(ProtocolError, match=reason) as caught:
        parse_headers(raw)
    assert caught.value.code == "bad-header"


def test_flow_headers_round_trip_and_jobs_without_them_are_not_flow_controlled() -> None:
    raw = format_headers(task="t", rate_limit="5/m", max_concurrency=3, concurrency_key="a:b")
    headers = parse_headers(raw)
    assert (headers.rate_limit, headers.max_concurrency, headers.concurrency_key) == (
        pytest.approx(5 / 60),
        3,
        "a:b",
    )
    assert not parse_headers(b"reply-requested,priority:3").flow


# ---- the core ---------------------------------------------------------------------------


def core_with(**config: object) -> CoreHarness:
    return CoreHarness(BrokerConfig(INTERVAL, LIVENESS, **config))  # type: ignore[arg-type]


def delivered(out: list[Effect]) -> list[bytes]:
    return [e.job.id for e in out if isinstance(e, Deliver)]


def workers(core: CoreHarness, n: int, queue: str = "default") -> None:
    for i in range(n):
        name = b"w%d" % i
        core.join(name, ((10, queue),), now=0.0)
        core.ready(name, now=0.0)


def test_a_rate_limited_task_waits_for_its_tokens_and_others_pass_it() -> None:
    core = core_with()
    workers(core, 4)
    limited = b"task:slow,rate-limit:2/s"
    assert delivered(core.request(b"c", b"s1", headers=limited, now=0.0)) == [b"s1"]
    assert delivered(core.request(b"c", b"s2", headers=limited, now=0.1)) == []  # throttled
    assert delivered(core.request(b"c", b"s3", headers=limited, now=0.1)) == []
    assert delivered(core.request(b"c", b"other", headers=b"task:fast", now=0.1)) == [b"other"]
    assert core.core.flow.wake == pytest.approx(0.5)  # the next token: the core's timer
    assert delivered(core.tick(0.49, keep_alive=(b"w1", b"w2", b"w3"))) == []
    assert delivered(core.tick(0.5, keep_alive=(b"w1", b"w2", b"w3"))) == [b"s2"]
    assert delivered(core.tick(1.0, keep_alive=(b"w2", b"w3"))) == [b"s3"]  # in order


def test_a_queue_rate_limit_holds_the_whole_queue_in_order() -> None:
    core = core_with(rate_limits=(("email", 1.0),))
    workers(core, 3, "email")
    sent = [delivered(core.request(b"c", b"e%d" % i, "email", now=0.0)) for i in range(3)]
    assert sent == [[b"e0"], [], []]
    monitor = {q["name"]: q for q in queues(core.core, now=0.5)}
    assert (monitor["email"]["throttled"], monitor["email"]["blocked"]) == (2, 0)
    assert delivered(core.tick(1.0, keep_alive=(b"w1", b"w2"))) == [b"e1"]


def test_a_job_blocked_by_its_key_does_not_block_other_keys_behind_it() -> None:
    core = core_with()
    workers(core, 3)
    keyed = b"task:t,max-concurrency:1,concurrency-key:"
    assert delivered(core.request(b"c", b"a1", headers=keyed + b"a", now=0.0)) == [b"a1"]
    assert delivered(core.request(b"c", b"a2", headers=keyed + b"a", now=0.0)) == []
    assert delivered(core.request(b"c", b"b1", headers=keyed + b"b", now=0.0)) == [b"b1"]
    assert delivered(core.request(b"c", b"plain", now=0.0)) == [b"plain"]  # a third worker
    assert delivered(core.request(b"c", b"b2", headers=keyed + b"b", now=0.0)) == []
    monitor = {q["name"]: q for q in queues(core.core, now=0.0)}
    assert (monitor["default"]["blocked"], monitor["default"]["depth"]) == (2, 2)
    # b1 ends: b2 goes, to b1's worker (its credit back), and a2 still waits for a1
    b1_worker = next(p for p in core.peers.values() if b"b1#1" in p.inflight).identity
    assert delivered(core.result(b1_worker, b"b1#1", OK_READY, b"{}", now=1.0)) == [b"b2"]
    plain_worker = next(p for p in core.peers.values() if b"plain#1" in p.inflight).identity
    assert delivered(core.result(plain_worker, b"plain#1", OK_READY, b"{}", now=1.0)) == []
    # a1 ends: a2 goes at once to the worker that was ready (its key is free)
    a1_worker = next(p for p in core.peers.values() if b"a1#1" in p.inflight).identity
    assert delivered(core.result(a1_worker, b"a1#1", OK_READY, b"{}", now=1.0)) == [b"a2"]


def test_a_job_sent_while_the_queue_was_held_back_and_no_worker_was_free_still_goes() -> None:
    """The gate remembers a queue it found held back (``FlowControl.stuck``) and then
    looks only at the jobs that came since: one that came while no worker was ready
    must be among them."""
    core = core_with()
    workers(core, 2)
    keyed = b"task:t,max-concurrency:1,concurrency-key:a"
    assert delivered(core.request(b"c", b"a1", headers=keyed, now=0.0)) == [b"a1"]
    assert delivered(core.request(b"c", b"a2", headers=keyed, now=0.0)) == []  # held back
    assert delivered(core.request(b"c", b"p", now=0.0)) == [b"p"]  # past it
    assert delivered(core.request(b"c", b"q", now=0.0)) == []  # no worker free
    p_worker = next(p for p in core.peers.values() if b"p#1" in p.inflight).identity
    assert delivered(core.result(p_worker, b"p#1", OK_READY, b"{}", now=0.1)) == [b"q"]
    a1_worker = next(p for p in core.peers.values() if b"a1#1" in p.inflight).identity
    assert delivered(core.result(a1_worker, b"a1#1", OK_READY, b"{}", now=0.2)) == [b"a2"]


@pytest.mark.parametrize(
    "headers", [b"rate-limit:abc", b"rate-limit:0/s", b"max-concurrency:-1", b"concurrency-key:k"]
)
def test_the_broker_answers_a_bad_flow_header_with_an_error_and_its_reason(headers: bytes) -> None:
    core = EmqpMachine(BrokerConfig(INTERVAL, LIVENESS), now=0.0)
    core.on_frontend(b"c", [b"", PROTOCOL, b"REQUEST", b"m1", b"q", headers, b"[]"], 0.0)
    refusals = [cmd for _, _, f in core.out if isinstance(cmd := decode(f), Error)]
    assert [(e.ref_msgid, e.code) for e in refusals] == [(b"m1", "bad-header")]
    assert headers.split(b":")[0].decode() in refusals[0].reason
    assert not core.core.queues.get("q") or not core.core.queues["q"].pending


def test_a_queue_whose_jobs_have_no_flow_header_still_prefetches() -> None:
    """An EventMQ client's jobs (no flow header, no EMQ_RATE_LIMITS): as before."""
    core = core_with()
    core.join(b"w", meta={**SLOT, "pid": 1}, now=0.0)
    core.ready(b"w", times=3, now=0.0)
    assert delivered(core.request(b"c", b"a", headers=b"reply-requested", now=0.0)) == [b"a"]
    assert delivered(core.request(b"c", b"b", headers=b"reply-requested", now=0.0)) == [b"b"]
    assert not core.core.queues["default"].gated
