"""Priority in BrokerCore (issue 33): a ranked queue dispatches higher first, FIFO
within a priority, with aging, sends each job to our worker processes with its
rank, and a job that outranks one they hold unstarted beyond their credit. Typed
commands in, typed effects out, fake ``now``."""

from __future__ import annotations

import pytest

from emq_django.broker.core import BrokerConfig
from emq_django.broker.effects import OK_READY, Deliver, Effect
from emq_django.broker.priority import RankedPending
from emq_django.broker.state import Job
from emq_django.protocol.headers import parse_headers
from emq_django.task import task
from tests.support.core_harness import CoreHarness
from tests.unit.test_broker_core import INTERVAL, LIVENESS

SLOT = {"role": "slot", "manager": "jm", "incarnation": "1", "slot": 0, "pid": 1}


def core_with(aging: float = 0.0) -> CoreHarness:
    return CoreHarness(BrokerConfig(INTERVAL, LIVENESS, priority_aging=aging))


def delivered(out: list[Effect]) -> list[bytes]:
    return [e.job.id for e in out if isinstance(e, Deliver)]


def send(core: CoreHarness, msgid: bytes, priority: int, now: float = 0.0) -> list[Effect]:
    return core.request(b"client", msgid, "default", b"priority:%d" % priority, now=now)


def test_a_ranked_queue_runs_higher_first_and_fifo_within_a_priority() -> None:
    core = core_with()
    core.join(b"w", meta=SLOT, now=0.0)
    core.ready(b"w", now=0.0)
    assert delivered(send(core, b"first", 0)) == [b"first"]
    for msgid, priority in ((b"low1", -5), (b"mid1", 0), (b"high", 7), (b"low2", -5)):
        send(core, msgid, priority)
    order = []
    running = b"first#1"
    for _ in range(4):
        out = core.result(b"w", running, OK_READY, b"{}", now=1.0)
        (job,) = delivered(out)
        order.append(job)
        running = job + b"#1"
    assert order == [b"high", b"mid1", b"low1", b"low2"]


def ranks(out: list[Effect]) -> list[float | None]:
    return [e.rank for e in out if isinstance(e, Deliver)]


def test_a_ranked_queue_prefetches_with_each_jobs_rank() -> None:
    core = core_with()
    core.join(b"w", meta=SLOT, now=0.0)
    core.ready(b"w", times=8, now=0.0)  # prefetch: credit for 8
    out = send(core, b"running", -1) + send(core, b"low", -1, 1.0) + send(core, b"high", 5, 2.0)
    assert delivered(out) == [b"running", b"low", b"high"]  # held by the process ...
    running, low, high = ranks(out)
    # ... which runs the best-ranked first: the same order as the broker's heap
    assert high is not None and low is not None and running is not None
    assert high < running < low


def test_a_job_that_outranks_a_held_one_goes_beyond_credit_to_that_process() -> None:
    """Nobody has credit: the high job goes to the worker process that holds a lower
    job unstarted (it runs the high one next), not to the queue to wait for it."""
    core = core_with()
    core.join(b"w", meta=SLOT, now=0.0)
    core.ready(b"w", times=2, now=0.0)
    assert delivered(send(core, b"running", -1) + send(core, b"low", -1)) == [b"running", b"low"]
    assert delivered(send(core, b"also-low", -1)) == []  # outranks nothing: waits
    out = send(core, b"high", 5)
    assert delivered(out) == [b"high"] and ranks(out)[0] is not None
    assert core.peers[b"w"].credit == -1 and core.counters["overtakes"] == 1
    # the answers pay the credit back: the waiting job goes after two of them
    assert delivered(core.result(b"w", b"running#1", now=1.0)) == []
    assert delivered(core.result(b"w", b"high#1", now=1.0)) == [b"also-low"]


def test_only_our_worker_processes_get_jobs_beyond_credit() -> None:
    core = core_with()
    core.join(b"plain", now=0.0)  # an EventMQ job manager: READY per free worker
    core.ready(b"plain", times=2, now=0.0)
    assert delivered(send(core, b"running", -1) + send(core, b"low", -1)) == [b"running", b"low"]
    out = send(core, b"high", 5)
    assert delivered(out) == [] and core.counters["overtakes"] == 0
    assert ranks(core.result(b"plain", b"running#1", now=1.0)) == [None]  # no rank header


def test_a_client_cannot_send_a_rank() -> None:
    core = core_with()
    out = core.request(b"client", b"m", "default", b"rank:-1e12")
    assert [type(e).__name__ for e in out] == ["Refuse"]


def test_an_unranked_queue_still_prefetches() -> None:
    core = core_with()
    core.join(b"w", meta=SLOT, now=0.0)
    core.ready(b"w", times=3, now=0.0)
    assert delivered(send(core, b"a", 0)) == [b"a"]
    assert delivered(send(core, b"b", 0)) == [b"b"]


def test_aging_bounds_how_long_a_job_is_overtaken() -> None:
    pending = RankedPending(aging=0.1)  # 10 priority levels per second waited
    old = Job(b"old", "q", parse_headers(b"priority:0"), b"", None, enqueued_at=0.0)
    pending.append(old)
    # priority-50 jobs overtake it when they arrive less than 5 s after it
    for i, at in enumerate((1.0, 4.9, 5.1, 9.0)):
        pending.append(Job(b"h%d" % i, "q", parse_headers(b"priority:50"), b"", None, at))
    assert [pending.popleft().id for _ in range(5)] == [b"h0", b"h1", b"old", b"h2", b"h3"]


def test_a_job_given_back_goes_before_its_equals() -> None:
    pending = RankedPending(aging=0.0)
    jobs = [Job(b"j%d" % i, "q", parse_headers(b"priority:3"), b"", None, 1.0) for i in range(3)]
    pending.append(jobs[0])
    pending.append(jobs[1])
    pending.appendleft(jobs[2])
    assert pending[0] is jobs[2] and jobs[1] in pending
    pending.remove(jobs[1])
    assert [pending.popleft().id for _ in range(2)] == [b"j2", b"j0"] and not pending


@pytest.mark.parametrize(
    ("bad", "error"), [(101, ValueError), (-101, ValueError), ("1", TypeError)]
)
def test_task_priority_is_checked_where_it_is_declared(bad: object, error: type) -> None:
    with pytest.raises(error, match="priority"):
        task(priority=bad)(len)  # type: ignore[arg-type]


def test_a_ranked_queues_page_is_in_dispatch_order() -> None:
    """The monitor's waiting list (``JOBS WAITING``) pages a queue with priorities
    in the order its jobs will go, not in the heap's storage order."""
    from types import SimpleNamespace

    from emq_django.broker.priority import RankedPending

    jobs = [
        SimpleNamespace(headers=SimpleNamespace(priority=p), enqueued_at=float(t))
        for t, p in enumerate([0, 5, -3, 9, 5, 1, 0, 7, -1, 2])
    ]
    pending = RankedPending(0.0, jobs)
    order = [pending.popleft() for _ in range(len(jobs))]
    pending = RankedPending(0.0, jobs)
    assert pending.page(0, 4) + pending.page(4, 4) + pending.page(8, 4) == order
    assert [j.headers.priority for j in order] == [9, 7, 5, 5, 2, 1, 0, 0, -1, -3]


def test_a_slot_that_may_reorder_is_timed_out_on_its_longest_limit_and_held() -> None:
    """The broker cannot tell which ranked job a worker process of ours started (it
    runs the best-ranked it holds): past the longest time limit of those it holds
    (and the grace) since its last answer, its attempts wait for its job manager's
    word (as a lost process's), none is failed at random."""
    core = core_with()
    core.join(b"w", meta=SLOT, now=0.0)
    core.ready(b"w", times=2, now=0.0)
    limits = ((b"a", -1, 5), (b"b", 5, 8))
    for msgid, priority, timeout in limits:
        headers = b"priority:%d,timeout:%d" % (priority, timeout)
        core.request(b"client", msgid, "default", headers, now=0.0)
    core.tick(1.0, keep_alive=[b"w"])  # the slot's clock starts
    core.tick(18.5, keep_alive=[b"w"])  # 17.5 s: past a's 5 + 10, not past b's 8 + 10
    assert b"w" in core.peers and core.counters["time_limits"] == 0
    core.tick(19.5, keep_alive=[b"w"])
    assert b"w" not in core.peers and core.counters["time_limits"] == 1
    assert set(core.held) == {b"a#1", b"b#1"}  # held for its job manager's word


@pytest.mark.parametrize("aging", [0.0, 0.5])
def test_a_ranked_queue_keeps_the_heaps_order_whatever_mix_of_jobs_comes(aging: float) -> None:
    """``RankedPending`` keeps jobs that come in rank order in a deque and the others
    in a heap: any mix of appends, jobs given back, removals and pops goes in the
    order of ``(rank_key, first in)``, as one heap of them all would."""
    import random

    from emq_django.broker.priority import rank_key

    rng = random.Random(33)
    pending: RankedPending[Job] = RankedPending(aging)
    model: list[tuple[tuple[float, float], int, Job]] = []
    seq = front = 0
    popped, expected = [], []
    for i in range(3000):
        op = rng.random()
        if op < 0.55 or not model:
            priority = rng.choice([0, 0, 0, 1, 5, -3]) if op < 0.5 else rng.randint(-100, 100)
            at = i * 0.01 + (rng.random() * 5 if op < 0.1 else 0.0)
            job = Job(b"j%d" % i, "q", parse_headers(b"priority:%d" % priority), b"", None, at)
            seq += 1
            pending.append(job)
            model.append((rank_key(job, aging), seq, job))
        elif op < 0.6:
            job = min(model, key=lambda m: m[:2])[2] if rng.random() < 0.5 else model[0][2]
            pending.remove(job)
            model = [m for m in model if m[2] is not job]
            front -= 1
            pending.appendleft(job)  # given back unstarted
            model.append((rank_key(job, aging), front, job))
        elif op < 0.65:
            job = rng.choice(model)[2]
            assert job in pending
            pending.remove(job)
            model = [m for m in model if m[2] is not job]
        else:
            head = min(model, key=lambda m: m[:2])
            model.remove(head)
            assert pending[0] is head[2]
            popped.append(pending.popleft())
            expected.append(head[2])
        assert len(pending) == len(model) and bool(pending) == bool(model)
    assert popped == expected
    assert sorted(j.id for j in pending) == sorted(m[2].id for m in model)
    assert pending.page(0, 10) == [m[2] for m in sorted(model, key=lambda m: m[:2])][:10]
