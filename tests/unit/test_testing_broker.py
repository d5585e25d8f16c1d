"""A user's tests with ``emq_django.testing``: only public API here, as in a
project that uses emq-django (docs/testing.md shows the same code)."""

from __future__ import annotations

import pytest

import emq_django as emq
from emq_django.client import get_client
from emq_django.testing import BrokerConfig, InMemoryBroker

calls: dict[str, int] = {}


@emq.task(retries=2)
def flaky(key: str) -> str:
    """Fails on its first two attempts, then succeeds."""
    calls[key] = calls.get(key, 0) + 1
    if calls[key] < 3:
        raise ConnectionError(f"attempt {calls[key]}: the mail server is down")
    return f"sent after {calls[key]} attempts"


@emq.task(retries=1)
def always_fails(key: str) -> None:
    raise ValueError(f"no such address: {key}")


@emq.task
def echo(value: str) -> str:
    return value


@emq.task
def count_to(n: int):  # a generator task: each value it yields is a partial result
    for i in range(1, n + 1):
        yield f"step {i}"
    return "done"


def test_a_task_with_two_retries_that_fails_twice_succeeds_on_its_third_attempt(emq_broker):
    result = flaky.delay("retried")

    emq_broker.advance(60)  # past both retries' backoff, on the test's clock

    assert result.get() == "sent after 3 attempts"
    assert calls["retried"] == 3


def test_a_retry_waits_for_the_clock(emq_broker):
    result = flaky.delay("waits")

    emq_broker.run()  # the first attempt fails; the retry waits for its backoff

    assert calls["waits"] == 1
    with pytest.raises(emq.ResultTimeout, match="advance"):
        result.get()


def test_a_countdown_job_runs_only_after_the_clock_advances(emq_broker):
    result = echo.apply_async(("later",), countdown=30)

    emq_broker.advance(29)
    assert not result.ready()

    emq_broker.advance(1)
    assert result.get() == "later"


def test_a_job_that_fails_past_its_retries_ends_in_the_dead_letters(emq_broker):
    result = always_fails.delay("nobody@example.com")
    emq_broker.advance(60)

    with pytest.raises(emq.TaskFailed, match="no such address"):
        result.get()
    [letter] = emq_broker.dead_letters()
    assert (letter["id"], letter["attempts"]) == (result.id, 2)
    assert letter["error"] == "ValueError"


def test_a_streamed_result_yields_the_partials_then_the_value(emq_broker):
    result = count_to.delay(3)

    assert list(result.stream()) == ["step 1", "step 2", "step 3", "done"]


def test_a_job_over_the_queue_bound_is_refused_with_queue_full():
    with InMemoryBroker(BrokerConfig(max_pending=1)):
        first, waiting, refused = echo.delay("a"), echo.delay("b"), echo.delay("c")

        with pytest.raises(emq.QueueFull, match="is full"):
            refused.get()
        assert (first.get(), waiting.get()) == ("a", "b")


def test_a_job_for_an_unregistered_task_fails_with_task_not_found(emq_broker):
    def not_registered() -> None: ...

    unregistered = emq.Task(
        not_registered, queue="default", retries=0, timeout=0, guarantee=False, reply=True
    )

    with pytest.raises(emq.TaskFailed) as failed:
        unregistered.delay().get()
    assert failed.value.type == "emq_django.exceptions.TaskNotFound"


def test_bad_options_are_refused_where_the_job_is_sent(emq_broker):
    with pytest.raises(ValueError, match="countdown"):
        echo.apply_async(("x",), countdown=-1)


def test_a_result_is_found_by_its_id(emq_broker):
    job_id = echo.delay("by id").id

    assert emq.result(job_id).get() == "by id"


def test_a_cancelled_job_never_runs_and_its_result_says_so(emq_broker):
    result = echo.apply_async(("never",), countdown=10)

    assert get_client().cancel(result.id)
    emq_broker.advance(10)

    with pytest.raises(emq.Cancelled):
        result.get()


@emq.task(reply=False)
def fire_and_forget(value: str) -> None: ...


def test_refused_jobs_sent_without_reply_are_raised_by_the_next_send():
    with InMemoryBroker(BrokerConfig(max_pending=1)):
        fire_and_forget.delay("running")
        fire_and_forget.delay("waiting")
        fire_and_forget.delay("refused")

        with pytest.raises(emq.JobsRefused) as refused:
            fire_and_forget.delay("not sent")
        assert refused.value.codes == {"queue-full"}


def test_a_job_a_day_ahead_runs_when_the_clock_gets_there(emq_broker):
    result = echo.apply_async(("tomorrow",), countdown=86_400)

    emq_broker.advance(86_399)
    assert emq_broker.delayed() == 1

    emq_broker.advance(1)
    assert result.get() == "tomorrow"


@emq.task
def polls(key: str) -> str:
    """Asks to be run again in 10 s until its third attempt."""
    calls[key] = calls.get(key, 0) + 1
    if calls[key] < 3:
        raise emq.Retry(delay=10, reason="not ready yet")
    return "ready"


def test_a_task_that_asks_for_a_retry_runs_again_after_its_delay(emq_broker):
    result = polls.delay("polled")

    emq_broker.advance(19)
    assert calls["polled"] == 2

    emq_broker.advance(1)
    assert result.get() == "ready"


def test_map_sends_one_job_per_call(emq_broker):
    results = echo.map([("a",), ("b",)])

    assert [r.get() for r in results] == ["a", "b"]


@emq.task(retries=1)
def streams_then_fails_once(key: str):
    calls[key] = calls.get(key, 0) + 1
    yield f"attempt {calls[key]}"
    if calls[key] == 1:
        raise ConnectionError("lost the feed")
    return "complete"


def test_a_retried_jobs_stream_goes_on_with_the_new_attempt(emq_broker):
    result = streams_then_fails_once.delay("stream")
    emq_broker.advance(60)

    assert list(result.stream()) == ["attempt 1", "attempt 2", "complete"]
    assert result.attempt == 2


@emq.task
def waits_for_its_own_queue() -> str:
    return echo.delay("inner").get()


def test_a_task_waiting_for_a_job_on_its_own_queue_is_told_why(emq_broker):
    result = waits_for_its_own_queue.delay()

    with pytest.raises(emq.TaskFailed, match="waits for the one worker of queue 'default'"):
        result.get()
