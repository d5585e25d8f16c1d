"""Dispatch in BrokerCore: weights, rotation, credit, unserved queues, the pending
bound. Typed commands in, typed effects out (tests/support/core_harness.py), fake
``now``; what the eMQP wire carries is in test_broker_core.py."""

from __future__ import annotations

from emq_django.broker.core import BrokerConfig
from emq_django.broker.effects import OK_READY, Acknowledge, Deliver, Effect, Outcome, Refuse
from tests.support.core_harness import CoreHarness
from tests.unit.test_broker_core import BODY, INTERVAL, LIVENESS

Out = list[Effect]
DEFAULT = ((10, "default"),)


def make_core(max_pending: int = 100_000) -> CoreHarness:
    return CoreHarness(BrokerConfig(INTERVAL, LIVENESS, max_pending))


def inform(core: CoreHarness, ident: bytes, queues: tuple[tuple[int, str], ...] = DEFAULT) -> Out:
    return core.join(ident, queues, now=0.0)


def ready(core: CoreHarness, ident: bytes, times: int = 1) -> Out:
    return core.ready(ident, times, now=0.0)


def request(core: CoreHarness, client: bytes, msgid: bytes, queue: str = "default") -> Out:
    return core.request(client, msgid, queue, b"", BODY, now=0.0)


def reply(core: CoreHarness, ident: bytes, attempt_id: bytes, status: Outcome = OK_READY) -> Out:
    return core.result(ident, attempt_id, status, b'{"value": 3}', now=0.0)


def requests_to(out: Out, ident: bytes) -> list[Deliver]:
    return [e for e in out if isinstance(e, Deliver) and e.peer.identity == ident]


def to_client(out: Out, client: bytes) -> list[Effect]:
    return [e for e in out if isinstance(e, (Acknowledge, Refuse)) and e.client.identity == client]


def test_dispatch_goes_to_the_highest_weight_with_credit() -> None:
    core = make_core()
    inform(core, b"light", ((10, "default"),))
    inform(core, b"heavy", ((40, "default"),))
    ready(core, b"light")
    ready(core, b"heavy")
    out = request(core, b"client", b"c1")
    assert [r.job.attempt_id for r in requests_to(out, b"heavy")] == [b"c1#1"]
    assert requests_to(out, b"light") == []
    # heavy has no credit left: the next job goes to the lighter one
    out = request(core, b"client", b"c2")
    assert [r.job.attempt_id for r in requests_to(out, b"light")] == [b"c2#1"]


def test_dispatch_rotates_among_equal_weights() -> None:
    core = make_core()
    for ident in (b"a", b"b"):
        inform(core, ident)
    ready(core, b"a", times=2)
    ready(core, b"b", times=2)
    targets = []
    for n in range(4):
        out = request(core, b"client", b"c%d" % n)
        targets += [e.peer.identity for e in out if isinstance(e, Deliver)]
    assert targets == [b"a", b"b", b"a", b"b"]


def test_credit_from_ready_and_from_reply_ok_ready() -> None:
    core = make_core()
    inform(core, b"w")
    ready(core, b"w", times=2)
    sent = [
        r.job.attempt_id
        for n in range(3)
        for r in requests_to(request(core, b"c", b"j%d" % n), b"w")
    ]
    assert sent == [b"j0#1", b"j1#1"]  # two credits, the third job waits
    assert len(core.queues["default"].pending) == 1
    # a REPLY without `ready` (EventMQ's) gives no credit back
    assert requests_to(reply(core, b"w", b"j0#1", Outcome(failed=False)), b"w") == []
    assert len(core.queues["default"].pending) == 1
    # a REPLY with `ok,ready` gives it back: the waiting job goes out at once
    assert [r.job.attempt_id for r in requests_to(reply(core, b"w", b"j1#1"), b"w")] == [b"j2#1"]
    assert not core.queues["default"].pending
    # a separate READY gives one more credit: the next job goes out immediately
    ready(core, b"w")
    assert [r.job.attempt_id for r in requests_to(request(core, b"c", b"j3"), b"w")] == [b"j3#1"]
    assert core.peers[b"w"].credit == 0
    assert core.counters["succeeded"] == 2


def test_job_for_an_unserved_queue_waits_until_a_job_manager_serves_it() -> None:
    core = make_core()
    inform(core, b"default-only")
    ready(core, b"default-only")
    out = request(core, b"client", b"e1", queue="email")
    (ack,) = to_client(out, b"client")
    assert isinstance(ack, Acknowledge) and ack.msgid == b"e1"
    assert [type(e) for e in out] == [Acknowledge]  # nothing to the default worker
    assert len(core.queues["email"].pending) == 1
    inform(core, b"mailer", ((40, "email"), (10, "default")))
    out = ready(core, b"mailer")
    assert [(r.job.attempt_id, r.job.queue) for r in requests_to(out, b"mailer")] == [
        (b"e1#1", "email")
    ]
    assert not core.queues["email"].pending


def test_ready_takes_the_job_of_the_highest_weight_queue_first() -> None:
    core = make_core()
    request(core, b"client", b"d1", queue="default")
    request(core, b"client", b"e1", queue="email")
    inform(core, b"w", ((10, "default"), (40, "email")))
    out = ready(core, b"w", times=2)
    assert [r.job.attempt_id for r in requests_to(out, b"w")] == [b"e1#1", b"d1#1"]


def test_pending_bound_refuses_with_queue_full() -> None:
    core = make_core(max_pending=2)
    for n in range(2):
        request(core, b"client", b"c%d" % n)
    out = request(core, b"client", b"c2")
    cmds = to_client(out, b"client")
    assert len(cmds) == 1 and isinstance(cmds[0], Refuse)
    assert cmds[0].msgid == b"c2" and cmds[0].code == "queue-full"
    assert "full" in cmds[0].reason
    assert len(core.queues["default"].pending) == 2
    assert core.counters["refused"] == 1
