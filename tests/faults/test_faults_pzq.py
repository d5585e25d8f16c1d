"""Fault injection on the PZQ port: a producer with confirmations (tests/pzq_client.py)
sends 20,000 messages while two consumer processes (tests/faults/pzq_consumer.py)
ack them, and something is killed with SIGKILL in the middle.

The history checker then holds the broker to its word: every message answered
'1' is delivered at least once (lost = 0); duplicates are counted and reported,
and allowed only for messages in flight at the kill (sent and not yet answered,
or delivered and not yet acked).
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.e2e.test_pzq import pzq_monitor, start_pzq_broker
from tests.faults.history import History, assert_clean, report
from tests.pzq_client import ConfirmingProducer
from tests.support import EmqProcesses, ManagedProcess, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.faults, pytest.mark.timeout(420)]

MESSAGES = int(os.environ.get("PZQ_FAULT_MESSAGES", "20000"))


@pytest.fixture
def history(tmp_path: Path) -> History:
    return History(tmp_path / "history.jsonl")


def start_consumer(
    procs: EmqProcesses, env: dict[str, str], history: History, name: str, hold_after: int = -1
) -> ManagedProcess:
    argv = [sys.executable, "-m", "tests.faults.pzq_consumer", env["EMQ_PZQ_SEND_BIND"]]
    argv += [str(history.path), "--hold-after", str(hold_after)]
    proc = procs.start_program(argv, name=name)
    procs.wait_for_output(proc, "consuming", stream="stdout")
    return proc


def start_producer(
    env: dict[str, str], history: History, keys: list[str]
) -> tuple[ConfirmingProducer, threading.Thread]:
    producer = ConfirmingProducer(env["EMQ_PZQ_RECEIVE_BIND"], window=2000, resend_after=5.0)
    thread = threading.Thread(target=producer.run, args=(keys, history.accept), daemon=True)
    thread.start()
    return producer, thread


def drain(history: History, timeout: float = 120.0) -> None:
    """Until every confirmed message has been done by a consumer (or the time-out;
    the verdict then names the lost ones)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if history.accepted <= set(history.completions()):
            return
        time.sleep(0.3)


# ---- p1. SIGKILL the broker while confirmations and deliveries are in flight --------


def test_pzq_broker_killed_mid_stream_loses_no_confirmed_message(
    emq_processes: EmqProcesses, emq_env: dict[str, str], history: History
) -> None:
    # a lease longer than a restart on a busy machine: redeliveries come from the kill
    extra = {"EMQ_PZQ_ACK_TIMEOUT": "15"}
    broker = start_pzq_broker(emq_processes, emq_env, **extra)
    for name in ("c1", "c2"):
        start_consumer(emq_processes, emq_env, history, name)
    keys = [f"p1-{n}" for n in range(MESSAGES)]
    producer, thread = start_producer(emq_env, history, keys)

    # the worst moment: half confirmed, a window of sends unanswered, consumers busy
    wait_until(
        lambda: len(producer.confirmed_at) >= MESSAGES // 2 and producer.outstanding > 0,
        "half of the messages confirmed",
        timeout=120,
    )
    kill_t = time.time()
    emq_processes.send_signal(broker, signal.SIGKILL)
    emq_processes.wait_for_exit(broker)
    start_pzq_broker(emq_processes, emq_env, name="broker-2", **extra)  # same journal
    restart_t = time.time()
    thread.join(timeout=240)
    assert not thread.is_alive(), "the producer did not get through the restart"
    drain(history)

    confirmed_after = [t for t in producer.confirmed_at.values() if t >= restart_t]
    back_t = min(confirmed_after, default=restart_t)  # the producer sees the broker again
    history.fault(kill_t, back_t)
    in_flight = {
        key
        for key, sent in producer.first_sent.items()
        if sent <= back_t and producer.confirmed_at[key] >= kill_t
    }
    done = history.records()
    done_before = [r for r in done if r["t"] <= kill_t]
    just_before = [r for r in done_before if r["t"] >= kill_t - 0.2]

    verdict = history.verdict(in_flight=frozenset(in_flight))
    report("pzq-broker", verdict)
    redelivered = {r["key"] for r in done_before} & set(verdict.duplicates)
    earliest = min((r["t"] for r in done_before if r["key"] in redelivered), default=kill_t)
    resent = producer.resent()
    print(
        f"[pzq-broker] at the kill: {len(producer.unconfirmed_at(kill_t))} sent and "
        f"unanswered, {len(done_before)} done ({len(just_before)} in its last 0.2 s); "
        f"resent {len(resent)}, refused {producer.refused}; "
        f"broker back for the producer {back_t - kill_t:.1f} s after the kill"
    )
    print(
        f"[pzq-broker] duplicates: {len(redelivered)} done before the kill and again "
        f"after it (acks not yet journaled; the earliest done {kill_t - earliest:.2f} s "
        f"before the kill), {len(set(verdict.duplicates) & resent)} "
        "stored twice (answer lost at the kill, the producer sent it again), "
        f"{len(set(verdict.duplicates) - redelivered - resent)} delivered before the kill "
        "and done after it (still in a consumer's queue)"
    )
    assert verdict.accepted == MESSAGES
    assert_clean(verdict)
    # the kill did strike in the middle of both streams
    assert producer.unconfirmed_at(kill_t), "no confirmation was in flight at the kill"
    assert just_before and len(done_before) < MESSAGES, "no delivery was in flight at the kill"
    # the producer sent again only what the kill left unanswered
    assert resent <= in_flight, sorted(resent - in_flight)[:20]
    figures = pzq_monitor(emq_env)
    deadline = time.monotonic() + 30
    while figures["messages"] != "0" and time.monotonic() < deadline:
        time.sleep(0.2)
        figures = pzq_monitor(emq_env)
    assert figures["messages"] == "0", figures  # every delivery acked, none left stored


# ---- p2. SIGKILL a consumer holding unacked messages -------------------------------


def test_pzq_consumer_killed_holding_messages_they_come_again_after_the_ack_timeout(
    emq_processes: EmqProcesses, emq_env: dict[str, str], history: History
) -> None:
    ack_timeout = 3.0
    start_pzq_broker(emq_processes, emq_env, EMQ_PZQ_ACK_TIMEOUT=str(ack_timeout))
    start_consumer(emq_processes, emq_env, history, "survivor")
    victim = start_consumer(emq_processes, emq_env, history, "victim", hold_after=500)
    keys = [f"p2-{n}" for n in range(MESSAGES)]
    producer, thread = start_producer(emq_env, history, keys)

    wait_until(lambda: len(history.records("held")) >= 50, "the victim to hold messages", 120)
    kill_t = time.time()
    emq_processes.send_signal(victim, signal.SIGKILL)
    emq_processes.wait_for_exit(victim)
    history.fault(kill_t)
    thread.join(timeout=240)
    assert not thread.is_alive(), "the producer did not finish"
    drain(history)

    verdict = history.verdict()
    report("pzq-consumer", verdict)
    held = {r["key"]: r["t"] for r in history.records("held")}
    first_done: dict[str, float] = {}
    for r in history.records():
        first_done.setdefault(r["key"], r["t"])
    delays = sorted(first_done[key] - t for key, t in held.items() if key in first_done)
    print(
        f"[pzq-consumer] {len(held)} held at the kill; delivered again after "
        f"{delays[0]:.2f} s (min), {statistics.median(delays):.2f} s (median)"
        if delays
        else f"[pzq-consumer] {len(held)} held, none delivered again"
    )
    assert verdict.accepted == MESSAGES
    assert_clean(verdict)
    assert set(held) <= set(first_done), "held messages never delivered again"
    assert producer.resent() == set()  # the broker never went away
    # they came back by their lease, not at once: an ack time-out (3 s) counted from
    # their dispatch, which the victim's receipt followed closely
    assert delays[0] >= ack_timeout / 3, delays[:5]
