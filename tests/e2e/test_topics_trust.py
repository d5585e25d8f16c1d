"""Topics you can trust (issue 30): a real broker process (``manage.py emq_broker``),
the Event BUS client written from the document (tests/eventbus_client.py) and raw
sockets for the hostile ones, and the Python API (``emq.publish_many``,
``emq.subscribe``)."""

from __future__ import annotations

import os
import signal
import uuid
from typing import Any

import pytest
import zmq

import emq_django as emq
from emq_django.protocol import PROTOCOL
from tests.e2e import test_topics
from tests.e2e.test_topics import Sockets, bus, start, topics
from tests.support import EmqProcesses, wait_until

ctx = test_topics.ctx  # the fixture: sockets closed in teardown

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def fill(env: dict[str, str], n: int, topic: str = "/kept/x") -> None:
    """``n`` small events kept by the broker, numbered 1 .. n."""
    for start_at in range(0, n, 10_000):
        emq.publish_many(topic, range(start_at, min(start_at + 10_000, n)))
    wait_until(lambda: topics(env)["last_seq"] == n, f"{n} events", 120)


def replays(env: dict[str, str]) -> dict[str, Any]:
    figures: dict[str, Any] = topics(env)["ports"]["eventbus"]
    return figures


def emqp_round_trip(ctx: Sockets, env: dict[str, str]) -> None:
    """A guaranteed REQUEST and its ACK on the broker's eMQP frontend."""
    client = ctx.socket(zmq.DEALER, env["EMQ_BROKER_URL"])
    msgid = str(uuid.uuid4()).encode()
    body = b'["run", {"callable": "add", "path": "tests.tasks", "args": [2, 3], "kwargs": {}}]'
    client.send_multipart([b"", PROTOCOL, b"REQUEST", msgid, b"nobody", b"guarantee", body])
    assert client.poll(30_000), "no ACK from the broker"
    frames = client.recv_multipart()
    assert frames[2] == b"ACK" and frames[4] == msgid, frames


def test_snapshots_are_paced_by_their_client_and_stop_for_a_gone_peer(
    emq_client_env: dict[str, str], emq_processes: EmqProcesses, ctx: Sockets
) -> None:
    """Ten clients ask for every kept event and close at once; one more asks and
    reads nothing. The broker does not build a replay for anyone at once: what the
    gone ones were owed stops when they are found gone, the silent one's replay
    waits on its own pipe, and meanwhile the broker answers an eMQP round trip."""
    env = emq_client_env
    broker = start(emq_processes, env)
    n = 60_000
    fill(env, n)
    for _ in range(10):
        gone = ctx.socket(zmq.DEALER, env["EMQ_BUS_SNAPSHOT_BIND"])
        gone.send_multipart([b"SYNCSTART", b"", b"0"])
        gone.close(linger=500)  # the request leaves; nothing is read
    # a small queue and kernel buffer: its pipe fills long before 60,000 SYNCs
    silent = ctx.context.socket(zmq.DEALER)
    ctx.opened.append(silent)
    silent.setsockopt(zmq.LINGER, 0)
    silent.rcvhwm, silent.rcvbuf = 100, 4096
    silent.connect(env["EMQ_BUS_SNAPSHOT_BIND"])
    silent.send_multipart([b"SYNCSTART", b"", b"0"])
    wait_until(
        lambda: replays(env)["replays_abandoned"] == 10 and replays(env)["syncs"] == 11,
        "the gone peers' replays stopped",
        60,
        procs=[broker],
    )
    emqp_round_trip(ctx, env)
    figures = replays(env)
    assert figures["replays"] == 1  # the silent client's, still under way
    # nothing like 11 x 60,000 SYNCs was made: each replay went as far as its pipe
    assert figures["synced_events"] < 11 * n // 2, figures
    # the silent client reads: it gets every event, then SYNCEND at the bus's sequence
    got = 0
    while True:
        assert silent.poll(30_000), f"{got} SYNCs, then nothing"
        frames = silent.recv_multipart()
        if frames[0] == b"SYNCEND":
            break
        assert frames[0] == b"SYNC" and int(frames[2]) == got + 1
        got += 1
    assert got == n and frames[2] == b"%d" % n
    wait_until(lambda: replays(env)["replays"] == 0, "the replay done", procs=[broker])


def test_a_snapshot_longer_than_a_page_ends_at_the_bus_sequence(
    emq_client_env: dict[str, str], emq_processes: EmqProcesses, ctx: Sockets
) -> None:
    """A client written to the document (one SYNCSTART, SYNCs until SYNCEND, whose
    sequence is the bus's) gets all 150,000 kept events: no page it must know of.
    The rule keeps them all: under the default (100,000) a retention prune due
    while the snapshot was read removed events from its middle."""
    env = emq_client_env
    start(emq_processes, env, EMQ_TOPIC_RETENTION='{"": {"max_count": 200000}}')
    n = 150_000
    fill(env, n)
    events, current = bus(env, ctx).sync("", since=0, timeout=120)
    assert current == n
    assert [e.seq for e in events] == list(range(1, n + 1))


def test_a_pub_with_a_timestamp_out_of_range_is_refused_and_the_snapshot_still_ends(
    emq_client_env: dict[str, str], emq_processes: EmqProcesses, ctx: Sockets
) -> None:
    """A PUB whose timestamp frame is 23 digits (a date past the year 9999) is
    dropped as malformed, counted; the good events around it are served."""
    env = emq_client_env
    broker = start(emq_processes, env)
    client = bus(env, ctx)
    client.publish("/ts/ok", 1)
    good = client_frames("/ts/bad", b"99999999999999999999999")
    client.publish_raw(good)
    client.publish("/ts/ok", 2)
    wait_until(
        lambda: topics(env)["ports"]["eventbus"]["malformed"] == 1 and topics(env)["last_seq"] == 2,
        "the bad PUB counted, the good ones kept",
        procs=[broker],
    )
    events, current = client.sync("", since=0)
    assert [(e.seq, e.data) for e in events] == [(1, 1), (2, 2)] and current == 2


def client_frames(topic: str, ts: bytes) -> list[bytes]:
    """A PUB as the document has it, with the timestamp frame given."""
    import msgpack

    return [topic.encode(), b"", b"p", ts, str(uuid.uuid4()).encode(), msgpack.packb("x")]


def test_a_process_exiting_with_unconfirmed_events_logs_their_exact_count(
    emq_client_env: dict[str, str], emq_processes: EmqProcesses
) -> None:
    """The broker is paused (SIGSTOP) past the publisher's confirmation time-out:
    the process that published 2,000 events and exits says that those 2,000 were
    not confirmed, rather than exiting in silence."""
    env = emq_client_env
    broker = start(emq_processes, env)
    code = (
        "import emq_django as emq\n"
        "for start in range(0, 2000, 100):\n"
        "    emq.publish_many('/exit/x', range(start, start + 100))\n"
        "print('published', flush=True)\n"
    )
    os.kill(broker.pid, signal.SIGSTOP)
    try:
        publisher = emq_processes.start(
            "shell", "-c", code, env={"EMQ_BUS_CONFIRM_TIMEOUT": "1"}, name="publisher"
        )
        assert emq_processes.wait_for_exit(publisher, 60) == 0
    finally:
        os.kill(broker.pid, signal.SIGCONT)
    assert "published" in publisher.stdout()
    assert "exits with 2000 events not confirmed by the broker" in publisher.stderr()


def test_publish_many_raises_the_count_it_could_not_get_confirmed_then_confirms_it(
    emq_client_env: dict[str, str], emq_processes: EmqProcesses, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the broker paused, publishing goes on until the window of unconfirmed
    events is full, then raises ``PublishUnconfirmed`` naming how many; once the
    broker goes on, exactly those are numbered and ``wait_published`` confirms them."""
    from emq_django.conf import reset_cached_settings

    env = emq_client_env
    broker = start(emq_processes, env)
    emq.publish("/window/warm", 0)
    emq.wait_published()
    monkeypatch.setenv("EMQ_BUS_CONFIRM_TIMEOUT", "1")
    reset_cached_settings()
    os.kill(broker.pid, signal.SIGSTOP)
    try:
        with pytest.raises(emq.PublishUnconfirmed) as raised:
            for start_at in range(0, 200_000, 1000):
                emq.publish_many("/window/x", range(start_at, start_at + 1000))
    finally:
        os.kill(broker.pid, signal.SIGCONT)
    count = raised.value.count
    assert "no confirmation within 1 s" in str(raised.value)
    monkeypatch.setenv("EMQ_BUS_CONFIRM_TIMEOUT", "60")
    reset_cached_settings()
    emq.wait_published()  # every event it sent gets numbered and confirmed
    assert topics(env)["last_seq"] == 1 + count


def test_a_subscriber_behind_retention_is_told_which_events_expired(
    emq_client_env: dict[str, str], emq_processes: EmqProcesses, ctx: Sockets
) -> None:
    """Retention keeps 1,000 events; a subscriber asking from 0 after 5,000 were
    published gets ``EventsExpired`` naming 1 .. 4,000, then goes on with 4,001 ..
    5,000, each once. A foreign Event BUS client, which never asked to be told,
    still gets only SYNCs and SYNCEND (a command its library does not know could
    break it)."""
    env = emq_client_env
    broker = start(emq_processes, env, EMQ_TOPIC_RETENTION='{"": {"max_count": 1000}}')
    fill(env, 5000)
    wait_until(
        lambda: bus(env, ctx).sync("", since=0)[0][0].seq == 4001,
        "retention applied",
        30,
        procs=[broker],
    )
    with emq.subscribe("", since=0) as sub:
        with pytest.raises(emq.EventsExpired) as raised:
            sub.next(timeout=30)
        assert (raised.value.first, raised.value.last) == (1, 4000)
        got = [sub.next(timeout=30) for _ in range(1000)]
        assert [e.seq for e in got if e is not None] == list(range(4001, 5001))
        assert sub.next(timeout=0.5) is None
    assert topics(env)["ports"]["eventbus"]["expired_notices"] >= 1


def test_the_broker_answers_emqp_round_trips_during_a_publish_flood(
    emq_client_env: dict[str, str], emq_processes: EmqProcesses, ctx: Sockets
) -> None:
    """Two processes flood the collector with publish_many; an eMQP request sent
    once the flood is under way is acknowledged before the flood is over (a round
    took its events first, and the job sockets read after them got nothing for as
    long as the flood lasted)."""
    env = emq_client_env
    broker = start(emq_processes, env)
    n = 300_000
    code = (
        "import emq_django as emq\n"
        f"for start in range(0, {n}, 1000):\n"
        "    emq.publish_many('/flood/x', range(start, start + 1000))\n"
    )
    for name in ("flood-a", "flood-b"):
        emq_processes.start("shell", "-c", code, name=name)
    wait_until(lambda: topics(env)["last_seq"] > 10_000, "the flood under way", 60, procs=[broker])
    emqp_round_trip(ctx, env)
    assert topics(env)["last_seq"] < 2 * n  # acknowledged while the flood went on
