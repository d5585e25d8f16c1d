"""Giving memory back after a backlog: when (Reclaimer, fake clock) and what
(BrokerCore.compact keeps every behaviour and drops the peak's tables)."""

from __future__ import annotations

import platform
import sys

import pytest

from emq_django.broker.core import BrokerConfig
from emq_django.broker.effects import Acknowledge, Answer, Deliver, Refuse
from emq_django.broker.holding import RecentIds
from emq_django.broker.memory import (
    DRAINING,
    IDLE,
    Reclaimer,
    allocator_reexec,
    rss_bytes,
    trim_heap,
)
from tests.support.core_harness import CoreHarness, of_type


def reclaimer() -> Reclaimer:
    return Reclaimer(min_drop=1000, interval=5.0, check_every=1.0, quiet=100)


def test_reclaimer_waits_for_the_drain_to_end() -> None:
    r = reclaimer()
    assert not r.due(0, 0.0)
    assert not r.due(10_000, 1.0)  # a backlog: nothing to give back
    assert r.due(9_000, 2.0) is None  # draining, above half the peak
    assert r.due(7_990, 3.0) is None  # still: 2,010 fewer, but above half
    assert r.due(7_990, 4.0) is None  # quiet (stalled?), but most of it is still held
    assert r.due(4_000, 5.0) == DRAINING  # half way down: trim only
    assert r.due(4_000, 11.0) is None  # still again, but 40% of the peak is held
    assert r.due(1_000, 12.0) == DRAINING
    assert r.due(1_000, 13.0) is None  # at most once per interval
    assert r.due(1_000, 18.0) == IDLE  # quiet, a tenth of the peak before the drain
    assert r.reclaims == 3
    assert r.due(1_000, 30.0) is None  # nothing more went since


def test_reclaimer_reclaims_at_half_the_peak_during_a_long_drain() -> None:
    r = reclaimer()
    r.due(10_000, 0.0)
    assert not r.due(6_000, 1.0)  # moving fast, above half
    assert r.due(4_999, 2.0) == DRAINING  # below half, although still moving fast
    assert not r.due(2_000, 3.0)  # at most once per interval
    assert r.due(1_000, 8.0) == DRAINING  # below half the new peak (4,999)
    assert r.due(1_000, 14.0) == IDLE  # the drain is over: 9,000 fewer than before it
    assert not r.due(1_000, 20.0)
    assert r.reclaims == 3


def test_reclaimer_checks_at_most_once_per_check_interval() -> None:
    r = reclaimer()
    r.due(10_000, 0.0)
    assert not r.due(0, 0.5)  # too soon to look
    assert r.due(0, 1.0)


def test_reclaimer_ignores_small_drops() -> None:
    r = reclaimer()
    r.due(900, 0.0)
    assert not r.due(0, 1.0)
    assert not r.due(0, 100.0)
    assert r.reclaims == 0


def test_trim_heap_where_glibc_is() -> None:
    expected = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert trim_heap() is expected
    if sys.platform.startswith("linux"):
        assert rss_bytes() > 0


def drained_core(n: int) -> CoreHarness:
    """A core that queued ``n`` jobs and ran them all on one worker."""
    h = CoreHarness(BrokerConfig(max_pending=n + 1))
    for i in range(n):
        h.request(b"c", b"job-%d" % i, queue="q")
    h.join(b"w", queues=[(10, "q")])
    out = h.ready(b"w")
    for k in range(n):
        deliveries = of_type(out, Deliver)
        assert len(deliveries) == 1, f"job {k}: {len(deliveries)} deliveries"
        out = h.result(b"w", deliveries[0].job.attempt_id, now=1.0)
    h.take()
    return h


def test_compact_drops_the_backlogs_tables_and_keeps_the_dedupe_window() -> None:
    n = 5000
    h = drained_core(n)
    core = h.core
    assert not core.life.jobs and core.counters["succeeded"] == n
    big = sys.getsizeof(core.life.jobs)
    recent_before = list(core.life.recent._ids)
    core.compact()
    assert sys.getsizeof(core.life.jobs) < big // 50
    assert core.footprint() == 0 and len(core.life.recent) == n  # kept for de-duplication
    recent_after = list(core.life.recent._ids)
    assert recent_after == recent_before  # the same ids, in the same order...
    assert all(a is not b for a, b in zip(recent_after, recent_before, strict=True))  # fresh

    # a client resending a finished job gets its ACK and the job does not run again
    out = h.request(b"c", b"job-7", queue="q", now=2.0)
    to_clients = [e for e in out if isinstance(e, (Acknowledge, Answer, Refuse))]
    assert [(type(e), e.msgid) for e in to_clients] == [(Acknowledge, b"job-7")]  # type: ignore[union-attr]
    assert not of_type(out, Deliver)
    assert core.counters["duplicates"] == 1


def test_compact_keeps_waiting_and_running_jobs() -> None:
    h = CoreHarness(BrokerConfig())
    core = h.core
    for i in range(3):
        h.request(b"c", b"job-%d" % i, queue="q")
    h.join(b"w", queues=[(10, "q")])
    h.ready(b"w")
    core.compact()
    assert set(core.life.jobs) == {b"job-0", b"job-1", b"job-2"}
    assert list(core.inflight) == [b"job-0#1"]
    out = h.result(b"w", b"job-0#1", now=1.0)
    assert [d.job.attempt_id for d in of_type(out, Deliver)] == [b"job-1#1"]
    assert core.counters["succeeded"] == 1


@pytest.mark.parametrize("n", [0, 1])
def test_compact_of_an_empty_core_is_harmless(n: int) -> None:
    h = drained_core(n) if n else CoreHarness(BrokerConfig())
    core = h.core
    core.compact()
    core.compact()
    assert core.footprint() == 0 and len(core.life.recent) == n
    assert not of_type(h.take(), Acknowledge)


def test_recent_ids_expire_after_the_window_oldest_first() -> None:
    recent = RecentIds(window=10.0)
    recent.add(b"a", 0.0)
    recent.add(b"b", 5.0)
    recent.expire(10.0)
    assert b"a" in recent and b"b" in recent
    recent.expire(10.5)
    assert b"a" not in recent and b"b" in recent
    recent.expire(100.0)
    assert len(recent) == 0


def test_recent_ids_keep_at_most_limit_dropping_the_oldest() -> None:
    recent = RecentIds(window=60.0, limit=3)
    for i in range(5):
        recent.add(b"id-%d" % i, float(i))
    assert [i in recent for i in (b"id-0", b"id-1", b"id-2", b"id-3", b"id-4")] == [
        False,
        False,
        True,
        True,
        True,
    ]


def test_recent_id_added_again_keeps_its_place_with_the_new_time() -> None:
    recent = RecentIds(window=10.0, limit=3)
    recent.add(b"a", 0.0)
    recent.add(b"b", 1.0)
    recent.add(b"a", 8.0)  # e.g. a cancelled job's id, then its resend
    assert len(recent) == 2
    recent.expire(12.0)  # "a" comes first and is not due: expiry stops there
    assert b"a" in recent and b"b" in recent
    recent.add(b"c", 12.0)
    recent.add(b"d", 13.0)  # over the limit: the first in order goes
    assert b"a" not in recent and len(recent) == 3
    recent.compact()
    recent.expire(22.5)
    assert b"b" not in recent and b"c" not in recent and b"d" in recent


@pytest.mark.skipif(not trim_heap(), reason="no glibc malloc_trim here")
def test_allocator_reexec_runs_the_same_command_under_the_wanted_allocator() -> None:
    argv = ["/usr/bin/python3", "-X", "utf8", "manage.py", "emq_broker", "--max-pending", "5"]
    plan = allocator_reexec("malloc", {"HOME": "/h"}, "/venv/bin/python", argv)
    assert plan == (
        ["/venv/bin/python", "-X", "utf8", "manage.py", "emq_broker", "--max-pending", "5"],
        {"HOME": "/h", "PYTHONMALLOC": "malloc"},
    )


def test_allocator_reexec_never_twice_nor_for_nothing() -> None:
    argv = ["python", "manage.py", "emq_broker"]
    # PYTHONMALLOC set (by whoever started us, or by the re-execution itself): it wins
    assert allocator_reexec("malloc", {"PYTHONMALLOC": "malloc"}, "/p", argv) is None
    assert allocator_reexec("malloc", {"PYTHONMALLOC": "pymalloc"}, "/p", argv) is None
    assert allocator_reexec("", {}, "/p", argv) is None  # turned off
    assert allocator_reexec("pymalloc", {}, "/p", argv) is None  # what runs anyway
    assert allocator_reexec("malloc", {}, "", argv) is None  # no known interpreter
    assert allocator_reexec("malloc", {}, "/p", ["python"]) is None  # no known command


def test_the_allocator_setting_takes_values_of_pythonmalloc_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from emq_django.conf import get_settings

    assert get_settings().BROKER_PYTHONMALLOC == "malloc"
    monkeypatch.setenv("EMQ_BROKER_PYTHONMALLOC", "")
    assert get_settings().BROKER_PYTHONMALLOC == ""
    monkeypatch.setenv("EMQ_BROKER_PYTHONMALLOC", "jemalloc")
    with pytest.raises(ImproperlyConfigured, match="EMQ_BROKER_PYTHONMALLOC"):
        get_settings()
