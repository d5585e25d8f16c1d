"""The slot table's ring of attempts cancelled before they started (worker/slots.py):
the job manager writes it, every worker process (a forked child) reads it."""

from __future__ import annotations

import os

from emq_django.worker.slots import CANCELS, MAX_ATTEMPT_ID, SlotTable


def test_a_reader_gets_each_cancel_once_in_order() -> None:
    table = SlotTable(2)
    assert table.cancel_count() == 0
    assert table.cancels_since(0) == (0, [])
    table.cancel_unstarted(b"job-a#1")
    table.cancel_unstarted(b"job-b#2")
    seen, ids = table.cancels_since(0)
    assert (seen, ids) == (2, [b"job-a#1", b"job-b#2"])
    table.cancel_unstarted(b"job-c#1")
    assert table.cancels_since(seen) == (3, [b"job-c#1"])
    assert table.cancels_since(3) == (3, [])


def test_a_reader_far_behind_gets_the_last_ring_full_and_long_ids_are_cut() -> None:
    table = SlotTable(1)
    for i in range(CANCELS + 10):
        table.cancel_unstarted(b"j%d#1" % i)
    n, ids = table.cancels_since(0)
    assert n == CANCELS + 10
    assert ids == [b"j%d#1" % i for i in range(10, CANCELS + 10)]
    long_id = b"x" * (MAX_ATTEMPT_ID + 20)
    table.cancel_unstarted(long_id)
    assert table.cancels_since(n) == (n + 1, [long_id[:MAX_ATTEMPT_ID]])


def test_a_forked_process_sees_what_the_parent_writes_after_the_fork() -> None:
    table = SlotTable(1)
    read, write = os.pipe()
    go_read, go_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child, as a worker process: waits for the word, then reads
        try:
            os.read(go_read, 1)
            _, ids = table.cancels_since(0)
            os.write(write, b"|".join(ids) or b"-")
        finally:
            os._exit(0)
    table.cancel_unstarted(b"after-fork#3")
    os.write(go_write, b"x")
    got = os.read(read, 1024)
    os.waitpid(pid, 0)
    assert got == b"after-fork#3"


def test_a_process_remembers_a_cancel_it_read_before_the_job_reached_it() -> None:
    """The ring is read at a job's start; a cancelled job still waiting in the socket
    starts later, when the count has not moved since: it must still be known."""
    from tests.unit.test_credit import unconnected_worker

    table = SlotTable(1)
    worker = unconnected_worker(table)
    try:
        assert worker._was_cancelled(b"a#1") is False
        table.cancel_unstarted(b"later#1")
        assert worker._was_cancelled(b"b#1") is False  # reads the ring: "later" noted
        assert table.cancel_count() == worker._cancels_seen  # nothing new since
        assert worker._was_cancelled(b"later#1") is True
        assert worker._was_cancelled(b"c#1") is False
    finally:
        worker.context.destroy(linger=0)
