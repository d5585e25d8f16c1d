"""emq tasks for the benchmark, loaded by the job manager through EMQ_IMPORTS."""

import emq_django as emq
from bench.donesignal import mark_done


@emq.task(queue="bench", reply=False)
def noop() -> None:
    mark_done()


@emq.task(queue="bench", reply=False, guarantee=True)
def noop_guaranteed() -> None:
    mark_done()


@emq.task(queue="bench")
def echo(x: object) -> object:
    return x


@emq.task(queue="bench")
def sleepy(ms: float) -> None:
    """Takes ``ms`` milliseconds (bench/send_gap.py)."""
    import time

    time.sleep(ms / 1000)


@emq.task(queue="bench")
def stamp() -> float:
    """When a worker started it: ``time.monotonic()``, the machine's clock, which the
    sender's reads too (bench/send_gap.py)."""
    import time

    return time.monotonic()


# bench/workflow_bench.py: a chord of no-op members and its counting callback, and
# a chain of add-one steps (the same three tasks in bench/celery_app.py and
# bench/dramatiq_app.py)
@emq.task(queue="bench")
def wf_noop() -> None:
    """A chord member that does nothing."""


@emq.task(queue="bench")
def wf_count(results: list[object]) -> int:
    """A chord's callback: how many members returned their None."""
    return sum(1 for r in results if r is None)


@emq.task(queue="bench")
def wf_add_one(x: int) -> int:
    """A chain's step: the previous step's result, plus one."""
    return x + 1
