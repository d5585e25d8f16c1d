"""Tasks for bench/memory_backlog.py, loaded by its job managers through EMQ_IMPORTS.

No-ops with one small argument: the bench measures what the broker keeps per
queued job, so the job itself must cost nothing to run.
"""

import emq_django as emq


@emq.task(queue="memq", reply=False)
def idle(i: int) -> None:
    pass


@emq.task(queue="memq", reply=False, guarantee=True)
def idle_guaranteed(i: int) -> None:
    pass
