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
