"""Job records kept in shared memory so that they survive their worker process
(emq_django/worker/kept_records.py), and the recorder process writing each once."""

from __future__ import annotations

import os

from emq_django.worker.kept_records import KeptRecords
from emq_django.worker.recorder_process import SeenAttempts


def row(n: int) -> tuple:
    return (
        f"job-{n}#1".encode(), "app.tasks.t", "q", 10 * n, 10 * n + 5, n % 2 == 1,
        "ValueError" if n % 2 else "", 2, b'["run",{"args":[1]}]', b'{"value":%d}' % n,
        False, n,
    )  # fmt: skip


def test_records_written_in_a_child_process_are_read_by_its_parent_after_it_died() -> None:
    kept = KeptRecords(2)
    pid = os.fork()
    if pid == 0:  # the worker process: writes, then dies without handing anything over
        writer = kept.writer(1)
        for n in range(3):
            writer.add(*row(n))
        os._exit(0)
    os.waitpid(pid, 0)
    assert kept.take(1) == [row(n) for n in range(3)]
    assert kept.take(1) == []  # taken once
    assert kept.take(0) == []


def test_the_last_batch_handed_over_is_kept_until_the_next_one() -> None:
    kept = KeptRecords(1)
    writer = kept.writer(0)
    writer.add(*row(1))
    writer.handed_over()  # may still sit in the dead process's socket queue
    writer.add(*row(2))
    assert kept.take(0) == [row(1), row(2)]
    writer = kept.writer(0)
    writer.add(*row(1))
    writer.handed_over()
    writer.add(*row(2))
    writer.handed_over()  # the batch with row 1 is two batches old: gone
    writer.add(*row(3))
    assert kept.take(0) == [row(2), row(3)]


def test_a_full_area_keeps_nothing_more_and_says_so() -> None:
    kept = KeptRecords(1, area_size=150)
    writer = kept.writer(0)
    assert writer.add(*row(1))
    assert not writer.add(*row(2))
    assert kept.take(0) == [row(1)]


def test_the_recorder_process_takes_an_attempt_once() -> None:
    seen = SeenAttempts(size=2)
    assert not seen.check(("a", 1))
    assert seen.check(("a", 1))
    assert not seen.check(("a", 2))
    assert not seen.check(("b", 1))  # the older set is still asked
    assert seen.check(("a", 1))
