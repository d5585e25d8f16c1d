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
