"""A slow loop turn's ``cpu_ms`` is the loop thread's CPU time in it (broker/turns.py):
the other threads' work (the journal writer's, libzmq's) is not the loop's, and the
wall time the loop did not compute is its wait."""

from __future__ import annotations

import threading
import time

from emq_django.broker.turns import SLOW_TURN, TurnWatch


def _burn_until(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(1000))


def test_a_turn_that_sleeps_while_another_thread_computes_shows_little_cpu() -> None:
    watch = TurnWatch()
    stop = threading.Event()
    burner = threading.Thread(target=_burn_until, args=(stop,))
    burner.start()
    try:
        watch.begin()
        time.sleep(SLOW_TURN * 2)
        watch.end()
    finally:
        stop.set()
        burner.join()
    (turn,) = watch.recent
    assert turn["ms"] >= SLOW_TURN * 2 * 1000
    # the process computed all along (the other thread); the loop thread did not
    assert turn["cpu_ms"] < SLOW_TURN * 1000 / 2


def test_a_turn_that_computes_shows_its_cpu() -> None:
    watch = TurnWatch()
    watch.begin()
    started = time.thread_time()
    while time.thread_time() - started < SLOW_TURN * 1.5:
        sum(range(1000))
    watch.end()
    (turn,) = watch.recent
    assert turn["cpu_ms"] >= SLOW_TURN * 1.5 * 1000 - 0.1
    assert watch.slow == 1 and watch.turns == 1
