"""Fault injection for workflows (issue 34): a guaranteed chord of 500 members,
every seventh failing, with kill -9 of the broker (restarted on the same journal,
the chord sent again under its id) or of the job manager (another one takes over)
after about 150 members have run.

The history checker then holds for the chord's steps: every member ran (lost = 0),
the callback ran exactly once, and a step ran twice only when it was in flight at
the kill. Run with ``make faults``.
"""

from __future__ import annotations

import signal
import time

import pytest

import emq_django as emq
from tests.faults.history import History, assert_clean, report
from tests.faults.test_faults import (  # noqa: F401 - the fixtures
    client,
    fault_env,
    history,
    start_jm,
    wait_slots,
)
from tests.support import EmqProcesses, start_broker, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.faults, pytest.mark.timeout(300)]

MEMBERS = 500
KILL_AFTER = 150


def failing(i: int) -> bool:
    return i % 7 == 3


@pytest.mark.parametrize("victim", ["broker", "jobmanager"])
def test_t_guaranteed_chord_of_500_with_kill_9_runs_its_callback_once(
    emq_processes: EmqProcesses,
    client: dict[str, str],  # noqa: F811
    history: History,  # noqa: F811
    victim: str,
) -> None:
    from tests.faults.fault_tasks import chord_callback, chord_member

    broker = start_broker(emq_processes, client)
    jm = start_jm(emq_processes, "A")
    wait_slots(client, 2)
    keys = [f"m-{i}" for i in range(MEMBERS)]
    flow = emq.chord(
        [chord_member.s(key, failing(i)) for i, key in enumerate(keys)],
        chord_callback.s("callback"),
    )
    result = flow.delay()  # returns once the broker has journaled it
    for key in [*keys, "callback"]:
        history.accept(key)
    wait_until(
        lambda: len(history.completions()) >= KILL_AFTER, f"{KILL_AFTER} members to run", 120
    )

    start = time.time()
    killed = broker if victim == "broker" else jm
    emq_processes.send_signal(killed, signal.SIGKILL)
    emq_processes.wait_for_exit(killed)
    ran = len(history.completions())
    assert ran < MEMBERS, "the kill came too late: every member had run"
    if victim == "broker":
        again = start_broker(emq_processes, client, name="broker-2")  # same journal
        emq_processes.wait_for_output(again, "guaranteed jobs reloaded")
        history.fault(start, time.time())
        result = flow.apply_async(job_id=result.id)  # the broker knows it: not run again
    else:
        start_jm(emq_processes, "B")
        wait_slots(client, 2)
        history.fault(start, time.time())

    outcome = result.get(timeout=240)

    assert outcome == {"members": MEMBERS, "errors": sum(map(failing, range(MEMBERS)))}
    verdict = history.verdict()
    report(f"t-{victim}", verdict)
    print(f"[t-{victim}] {ran} of {MEMBERS} members had run at the kill")
    assert history.completions()["callback"] == 1  # exactly once
    assert_clean(verdict)  # every member ran; duplicates only for those in flight
    assert len(verdict.duplicates) <= 4, verdict.duplicates  # 2 slots and a prefetch each
