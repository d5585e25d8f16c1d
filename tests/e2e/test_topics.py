"""Topics end to end: a real broker process (``manage.py emq_broker``), the Event
BUS client written from the document (tests/eventbus_client.py), and the Python
API (``emq.publish``, ``emq.subscribe``, ``emq.asubscribe``, ``emq_tail``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import zmq

import emq_django as emq
from emq_django.exceptions import BrokerUnavailable
from emq_django.pubsub import Subscription
from tests.e2e.test_spine import monitor
from tests.eventbus_client import BusClient
from tests.support import EmqProcesses, ManagedProcess, free_tcp_ports, port_of, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]
FLOOD_PAD = "x" * 16000  # 2,000 of these are 32 MB: more than the loopback buffers hold


class Sockets:
    """A context whose sockets are all closed in teardown, even after a failure."""

    def __init__(self) -> None:
        self.context: zmq.Context[Any] = zmq.Context()
        self.opened: list[zmq.Socket[Any]] = []

    def socket(self, kind: int, url: str, sndhwm: int | None = None) -> zmq.Socket[Any]:
        sock = self.context.socket(kind)
        sock.linger = 0
        if sndhwm is not None:
            sock.sndhwm = sndhwm
        sock.connect(url)
        self.opened.append(sock)
        return sock


@pytest.fixture
def ctx() -> Iterator[Sockets]:
    sockets = Sockets()
    yield sockets
    for sock in sockets.opened:
        sock.close(linger=0)
    sockets.context.destroy(linger=0)


def bus(env: dict[str, str], ctx: Sockets, **kw: Any) -> BusClient:
    return BusClient(
        env["EMQ_BUS_SNAPSHOT_BIND"],
        env["EMQ_BUS_PUBLISH_BIND"],
        env["EMQ_BUS_COLLECT_BIND"],
        ctx.context,
        track=ctx.opened,
        **kw,
    )


def start(procs: EmqProcesses, env: dict[str, str], **extra: str) -> ManagedProcess:
    broker = procs.start("emq_broker", name=f"broker-{len(procs.processes)}", env=extra)
    for key in ("EMQ_MONITOR_BIND", "EMQ_BUS_SNAPSHOT_BIND", "EMQ_BUS_COLLECT_BIND"):
        procs.wait_for_port(port_of(env[key]), proc=broker)
    return broker


def restart(
    procs: EmqProcesses, broker: ManagedProcess, env: dict[str, str], **extra: str
) -> ManagedProcess:
    """Stop ``broker`` (it must exit cleanly) and start another on ``env``."""
    assert procs.stop(broker) == 0
    return start(procs, env, **extra)


def topics(env: dict[str, str]) -> dict[str, Any]:
    doc: dict[str, Any] = monitor(env)["topics"]
    return doc


def last_seq_or_none(env: dict[str, str]) -> int | None:
    """The broker's last sequence number, or None when the monitor is slow to answer."""
    try:
        return int(topics(env)["last_seq"])
    except BrokerUnavailable:
        return None


def bus_subscribers(env: dict[str, str]) -> int:
    return int(topics(env)["ports"].get("eventbus", {}).get("subscribers", 0))


def take(sub: Subscription, n: int, timeout: float = 60.0) -> list[emq.pubsub.Received]:
    got = []
    while len(got) < n:
        event = sub.next(timeout=timeout)
        assert event is not None, f"{len(got)} of {n} events, then nothing for {timeout} s"
        got.append(event)
    return got


def take_the_last(sub: Subscription, n: int) -> list[emq.pubsub.Received]:
    """``n`` events, and then no more."""
    got = take(sub, n)
    assert sub.next(timeout=1.5) is None
    return got


def assert_numbered(got: list[emq.pubsub.Received], n: int) -> None:
    """The events carrying 0 .. n-1, numbered 1 .. n: each once, in order."""
    assert [e.data for e in got] == list(range(n))
    assert [e.seq for e in got] == list(range(1, n + 1))


@contextlib.contextmanager
def flooded(env: dict[str, str], broker: ManagedProcess, rcvhwm: int) -> Iterator[Subscription]:
    """A subscriber of /flood/ with a tiny queue (``rcvhwm``) and kernel buffer, live
    once it has read the first event (data ``{"i": 0, "pad": FLOOD_PAD}``). No idle
    check: the jump in the sequence must be what sends it to the snapshot."""
    with emq.subscribe("/flood/", 0, rcvhwm=rcvhwm, rcvbuf=4096, idle_check=60) as sub:
        wait_until(lambda: bus_subscribers(env) >= 1, "subscribed", procs=[broker])
        emq.publish("/flood/0", {"i": 0, "pad": FLOOD_PAD})
        assert take(sub, 1)[0].data["i"] == 0
        yield sub


def assert_gaps_filled(sub: Subscription, n: int, what: str) -> None:
    """The flooded subscriber gets the other ``n - 1`` events, each once, in order,
    though it missed some ``what`` live (a test that dropped nothing tested nothing)."""
    got = take_the_last(sub, n - 1)
    assert [e.data["i"] for e in got] == list(range(1, n))  # none missing, each once
    state = sub.state
    assert state.live_seen < n, f"no {what} was dropped: the test did not test the gap"
    assert state.gaps > 0 and state.from_snapshot >= n - state.live_seen
    print(
        f"{n} events: {state.live_seen} came live, {state.from_snapshot} from the "
        f"snapshot after {state.gaps} gaps ({state.syncs} snapshot requests)"
    )


def test_sync_then_live_and_both_ways_between_emq_and_an_event_bus_client(
    emq_client_env: dict[str, str], emq_processes: EmqProcesses, ctx: Sockets
) -> None:
    env = emq_client_env
    broker = start(emq_processes, env)
    for i in range(3):
        emq.publish("/orders/created", {"id": i})
    emq.publish("/users/new", b"\x01raw")
    wait_until(lambda: topics(env)["last_seq"] == 4, "4 events", procs=[broker])

    external = bus(env, ctx)
    external.subscribe("/orders/")
    with emq.subscribe("/orders/", since=0) as sub:
        first = take(sub, 3)
        assert [(e.seq, e.topic, e.data) for e in first] == [
            (1, "/orders/created", {"id": 0}),
            (2, "/orders/created", {"id": 1}),
            (3, "/orders/created", {"id": 2}),
        ]
        wait_until(lambda: bus_subscribers(env) >= 2, "both subscribed", procs=[broker])
        external.publish("/orders/paid", {"from": "bus"})  # an Event BUS producer ...
        live = take(sub, 1)[0]  # ... reaches emq.subscribe
        assert (live.seq, live.topic, live.data) == (5, "/orders/paid", {"from": "bus"})
        emq.publish("/orders/shipped", [1, "two"])  # emq.publish ...
        # ... reaches the Event BUS client (which skips events 1-4 if the broker
        # sent them out after it subscribed: the monitor may answer "4 events"
        # before the round's events leave; older than its snapshot, a Clone client
        # skips them)
        got = []
        while len(got) < 2:
            event = external.receive(20.0)
            assert event is not None, f"{len(got)} of 2 events, then nothing for 20 s"
            if event.seq > 4:
                got.append(event)
        assert [(e.seq, e.topic, e.data) for e in got] == [
            (5, "/orders/paid", {"from": "bus"}),
            (6, "/orders/shipped", [1, "two"]),
        ]
        assert take(sub, 1)[0].seq == 6
    events, current = external.sync("", since=3)
    assert [e.seq for e in events] == [4, 5, 6] and current == 6
    assert events[0].data == b"\x01raw"  # raw bytes travel as a MessagePack bin


def test_asubscribe_yields_kept_then_live_events(
    emq_client_env: dict[str, str], emq_processes: EmqProcesses
) -> None:
    env = emq_client_env
    broker = start(emq_processes, env)
    emq.publish("/a/1", 1)
    wait_until(lambda: topics(env)["last_seq"] == 1, "1 event", procs=[broker])

    async def run() -> list[tuple[int, Any]]:
        got = []
        async for event in emq.asubscribe("/a/", since=0):
            got.append((event.seq, event.data))
            if len(got) == 1:
                emq.publish("/b/skip", 0)
                emq.publish("/a/2", 2)
            if len(got) == 2:
                break
        return got

    assert asyncio.run(asyncio.wait_for(run(), 60)) == [(1, 1), (3, 2)]


def test_offline_subscriber_gets_exactly_the_10000_events_across_a_broker_restart(
    emq_client_env: dict[str, str], emq_processes: EmqProcesses
) -> None:
    env = emq_client_env
    broker = start(emq_processes, env)
    emq.publish("/feed/start", "before")
    with emq.subscribe("/feed/", since=0) as sub:
        assert take(sub, 1)[0].data == "before"
        resume = sub.last
    # offline: 5,000 events, a restart, 5,000 more (the sequence goes on)
    for i in range(5000):
        emq.publish(f"/feed/{i % 7}", i)
    wait_until(lambda: topics(env)["last_seq"] == 5001, "5,001 events", 60, procs=[broker])
    broker = restart(emq_processes, broker, env)
    assert topics(env)["last_seq"] == 5001
    for i in range(5000, 10000):
        emq.publish(f"/feed/{i % 7}", i)
    wait_until(lambda: topics(env)["last_seq"] == 10001, "10,001 events", 60, procs=[broker])
    with emq.subscribe("/feed/", since=resume) as sub:
        got = take(sub, 10000)
        assert sub.next(timeout=1.5) is None  # and nothing more: each once
    assert [e.data for e in got] == list(range(10000))
    assert [e.seq for e in got] == list(range(2, 10002))


def test_a_live_subscription_goes_on_across_a_broker_restart(
    emq_client_env: dict[str, str], emq_processes: EmqProcesses
) -> None:
    """The SUB and snapshot sockets reconnect by themselves; the first event after
    the restart is a jump (or the idle check asks), and the snapshot fills in."""
    env = emq_client_env
    broker = start(emq_processes, env)
    # since=0 on a new broker: every event, whenever the first SYNCEND comes (with
    # since=None the events numbered before it would not count as live ones)
    with emq.subscribe("/live/", since=0, idle_check=0.5) as sub:
        wait_until(lambda: bus_subscribers(env) >= 1, "subscribed", procs=[broker])
        for i in range(100):
            emq.publish("/live/a", i)
        first = take(sub, 100)
        broker = restart(emq_processes, broker, env)
        for i in range(100, 200):
            emq.publish("/live/b", i)
        second = take_the_last(sub, 100)
    assert_numbered(first + second, 200)


def test_a_subscriber_behind_its_pub_buffer_fills_the_gap_from_the_snapshot(
    emq_client_env: dict[str, str], emq_processes: EmqProcesses
) -> None:
    env = emq_client_env
    broker = start(emq_processes, env, EMQ_BUS_PUBLISH_HWM="10")
    n = 2000
    with flooded(env, broker, rcvhwm=10) as sub:
        for i in range(1, n):  # the reader is slow: it reads nothing meanwhile
            emq.publish(f"/flood/{i % 3}", {"i": i, "pad": FLOOD_PAD})
        wait_until(lambda: topics(env)["last_seq"] == n, f"{n} events", 60, procs=[broker])
        assert_gaps_filled(sub, n, "message")


def test_10000_malformed_messages_on_each_event_bus_socket(
    emq_client_env: dict[str, str], emq_processes: EmqProcesses, ctx: Sockets
) -> None:
    env = emq_client_env
    broker = start(emq_processes, env)
    snapshot = ctx.socket(zmq.DEALER, env["EMQ_BUS_SNAPSHOT_BIND"])
    collector = ctx.socket(zmq.DEALER, env["EMQ_BUS_COLLECT_BIND"])
    # an XSUB drops what it cannot queue (it never blocks): no limit on this side,
    # so all 10,000 reach the broker however slowly it reads them
    xsub = ctx.socket(zmq.XSUB, env["EMQ_BUS_PUBLISH_BIND"], sndhwm=0)
    bad_snapshot = [[b"SYNCSTART", b"", b"-1"], [b"HELLO"], [b"SYNCSTART", b"\xff"], [b""]]
    bad_pub = [
        [b"/t", b"", b"p", b"", b"", b"\xc1"],  # not MessagePack
        [b"/t"],
        [b"", b"", b"p", b"", b"", b"\x01"],
        [b"/t", b"", b"p", b"", b"uuid?", b"\x01"],
    ]

    # an XSUB drops what it sends before its connection is up: wait for one good
    # subscription to reach the broker first
    def subscribed() -> bool:
        xsub.send(b"\x01/warm-up")
        return bus_subscribers(env) >= 1

    wait_until(subscribed, "the XSUB's subscription", procs=[broker])
    n = 10_000
    for i in range(n):
        snapshot.send_multipart(bad_snapshot[i % 4])
        collector.send_multipart(bad_pub[i % 4])
        xsub.send_multipart([b"\x05not a subscription", b"%d" % i])
        if i % 1000 == 999:
            assert broker.alive()
    wait_until(
        lambda: topics(env)["ports"]["eventbus"]["malformed"] >= 3 * n,
        "30,000 malformed messages counted",
        90,
        procs=[broker],
    )
    doc = monitor(env)
    assert doc["counters"]["dropped_malformed"] >= 3 * n
    assert doc["topics"]["last_seq"] == 0
    # still serving
    good = bus(env, ctx)
    good.publish("/ok", "fine")
    wait_until(lambda: topics(env)["last_seq"] == 1, "the good event", procs=[broker])
    events, current = good.sync("/ok")
    assert [e.data for e in events] == ["fine"] and current == 1
    assert broker.alive()


def test_emq_tail_prints_events(
    emq_client_env: dict[str, str], emq_processes: EmqProcesses
) -> None:
    env = emq_client_env
    broker = start(emq_processes, env)
    emq.publish("/orders/1", {"total": 5})
    emq.publish("/other/1", "no")
    wait_until(lambda: topics(env)["last_seq"] == 2, "2 events", procs=[broker])
    tail = emq_processes.start("emq_tail", "/orders/", "--since", "0", "--count", "2")
    wait_until(lambda: "/orders/1" in tail.stdout(), "the kept event printed", 30, procs=[broker])
    emq.publish("/orders/2", "live")
    assert emq_processes.wait_for_exit(tail, 30) == 0
    lines = tail.stdout().splitlines()
    assert lines == ['1 /orders/1 {"total": 5}', '3 /orders/2 "live"']
    assert json.loads(lines[0].split(" ", 2)[2]) == {"total": 5}


@pytest.fixture
def batch_env(emq_client_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """``emq_client_env`` with the broker's batch publisher on (EMQ_BUS_BATCH_BIND),
    for the broker and for ``emq.subscribe`` here."""
    from emq_django.conf import reset_cached_settings

    (port,) = free_tcp_ports(1)
    url = f"tcp://127.0.0.1:{port}"
    monkeypatch.setenv("EMQ_BUS_BATCH_BIND", url)
    reset_cached_settings()
    return {**emq_client_env, "EMQ_BUS_BATCH_BIND": url}


def test_the_batch_channel_goes_on_across_a_broker_restart(
    batch_env: dict[str, str], emq_processes: EmqProcesses, ctx: Sockets
) -> None:
    """emq.publish_many and emq.subscribe on the batch publisher: every event once,
    in order, across a restart, as on the Event BUS wire (which a bus client still
    reads unchanged)."""
    env = batch_env
    broker = start(emq_processes, env, EMQ_BUS_BATCH_BIND=env["EMQ_BUS_BATCH_BIND"])
    external = bus(env, ctx)
    external.subscribe("/batch/")
    with emq.subscribe("/batch/", since=0, idle_check=0.5) as sub:
        assert sub._on_live == sub.state.on_live_batch  # the batch publisher
        wait_until(lambda: bus_subscribers(env) >= 2, "subscribed", procs=[broker])
        emq.publish_many("/batch/a", range(3000))
        first = take(sub, 3000)
        on_bus = external.receive_n(3000, 60.0)
        assert [e.seq for e in on_bus] == list(range(1, 3001))
        figures = topics(env)["ports"]["eventbus"]
        assert figures["batched_events"] == 3000 and figures["batches"] < 3000
        broker = restart(emq_processes, broker, env, EMQ_BUS_BATCH_BIND=env["EMQ_BUS_BATCH_BIND"])
        for start_at in range(3000, 6000, 500):
            emq.publish_many("/batch/b", range(start_at, start_at + 500))
        second = take_the_last(sub, 3000)
    assert_numbered(first + second, 6000)


def test_a_subscriber_behind_the_batch_publisher_fills_the_gap_from_the_snapshot(
    batch_env: dict[str, str], emq_processes: EmqProcesses
) -> None:
    env = batch_env
    broker = start(
        emq_processes,
        env,
        EMQ_BUS_BATCH_BIND=env["EMQ_BUS_BATCH_BIND"],
        EMQ_BUS_PUBLISH_HWM="8",  # the batch publisher's queue: 2 batches
    )
    n = 2000
    with flooded(env, broker, rcvhwm=2) as sub:
        for start_at in range(1, n, 100):  # the reader is slow: it reads nothing meanwhile
            emq.publish_many(
                "/flood/x",
                [{"i": i, "pad": FLOOD_PAD} for i in range(start_at, start_at + 100) if i < n],
            )
        # the broker writes 32 MB meanwhile: a monitor request may wait past its 1 s
        wait_until(lambda: last_seq_or_none(env) == n, f"{n} events", 60, procs=[broker])
        assert_gaps_filled(sub, n, "batch")


def test_a_process_that_exits_right_after_publishing_loses_no_event(
    emq_client_env: dict[str, str], emq_processes: EmqProcesses
) -> None:
    """The bus never acknowledges a PUB: publish_many returns while its batches
    still wait in the socket's pipe. A process that exits right after must still
    deliver them (its publisher's context is terminated at exit, which sends
    what waits, up to the sockets' 5 s linger). Here the broker is stopped
    (SIGSTOP) while the process publishes, so nothing can leave before the
    process ends; the broker goes on (SIGCONT) once the process has ended or
    waits in its exit. Before the fix every event was lost so; a bench round
    once lost the last 300 of 20,000 events this way."""
    env = emq_client_env
    broker = start(emq_processes, env)
    n = 2_000
    code = (
        "import emq_django as emq\n"
        f"for start in range(0, {n}, 100):\n"
        "    emq.publish_many('/exit/x', [b'x' * 1024] * 100)\n"
        "print('published', flush=True)\n"
    )
    os.kill(broker.pid, signal.SIGSTOP)
    try:
        publisher = emq_processes.start("shell", "-c", code, name="exiting-publisher")
        wait_until(lambda: "published" in publisher.stdout(), "the events published", 60)
        # give it a second to end: without the fix it exits (its events with it);
        # with it, it waits (up to its linger, 5 s) for the broker to take them
        ended = time.monotonic() + 1.0
        while publisher.alive() and time.monotonic() < ended:
            time.sleep(0.05)
    finally:
        os.kill(broker.pid, signal.SIGCONT)
    assert emq_processes.wait_for_exit(publisher, 60) == 0
    wait_until(lambda: last_seq_or_none(env) == n, f"{n} events", 60, procs=[broker])
    with emq.subscribe("/exit/", since=0) as sub:
        got = take(sub, n)
        assert sub.next(timeout=1.0) is None
    assert [e.seq for e in got] == list(range(1, n + 1))


def released_bus_collector(ctx: Sockets) -> tuple[str, zmq.Socket[Any]]:
    """Stands for the released Event BUS's collector (micro-toolkit/event-bus-zeromq
    3.0.4, WIRE-NOTES): a ROUTER that takes a PUB's six frames by position and
    MessagePack-decodes the sixth, the data, whatever follows it."""
    sock = ctx.context.socket(zmq.ROUTER)
    sock.linger = 0
    ctx.opened.append(sock)
    url = f"tcp://127.0.0.1:{free_tcp_ports(1)[0]}"
    sock.bind(url)
    return url, sock


def test_publish_puts_messagepack_in_the_data_frame_for_every_content_type(
    ctx: Sockets,
) -> None:
    """Issue 30, item 10: on the Event BUS wire the data frame is MessagePack, so
    the released bus (which decodes it as such) gets the value published: JSON
    data as its value, bytes as bytes, text as text; six frames, no more. (The
    released bus knows no confirmed batch: ``confirm=False`` speaks its PUB.)"""
    url, collector = released_bus_collector(ctx)
    cases = [
        ({"a": 1}, "application/json"),
        (b"\x00raw\xff", "application/octet-stream"),
        (b"\x00raw\xff", None),
        ({"b": [1, 2]}, None),
        ('{"c": 3}', "text/plain"),
    ]
    for data, content_type in cases:
        emq.publish("/wire/a", data, content_type=content_type, url=url, confirm=False)
    got = []
    for _ in cases:
        assert collector.poll(10_000), "the PUB did not arrive"
        frames = collector.recv_multipart()[1:]  # the DEALER's identity first
        assert len(frames) == 6, frames
        got.append(msgpack.unpackb(frames[5], raw=False))
    assert got == [{"a": 1}, b"\x00raw\xff", b"\x00raw\xff", {"b": [1, 2]}, '{"c": 3}']


def test_subscribe_gets_the_snapshot_of_a_bus_that_routes_by_text_identity(
    ctx: Sockets,
) -> None:
    """Issue 30, item 9. Stands for the released Event BUS server (event-bus-zeromq
    3.0.4, Node): its snapshot ROUTER turns the requester's identity into a UTF-8
    string and routes the SYNCs and the SYNCEND back by that string, so a binary
    identity (libzmq's automatic one) never gets its answer, and a subscriber
    waiting for SYNCEND delivers nothing."""
    snapshot_url, publish_url = (f"tcp://127.0.0.1:{p}" for p in free_tcp_ports(2))
    snapshot = ctx.context.socket(zmq.ROUTER)  # drops what it cannot route, silently
    snapshot.linger = 0
    ctx.opened.append(snapshot)
    snapshot.bind(snapshot_url)
    publisher = ctx.context.socket(zmq.PUB)
    publisher.linger = 0
    ctx.opened.append(publisher)
    publisher.bind(publish_url)
    with emq.subscribe("/nb/", since=0, snapshot_url=snapshot_url, publish_url=publish_url) as sub:
        assert snapshot.poll(10_000), "no SYNCSTART"
        # a fourth frame (emq's notify-expired) follows; the released bus reads the
        # first three and ignores the rest
        identity, command, spec, since, *_ = snapshot.recv_multipart()
        assert (command, spec, since) == (b"SYNCSTART", b"/nb/", b"0")
        back = identity.decode("utf-8", "replace").encode()  # as a JavaScript string
        event = [b"/nb/a", b"1", b"node", b"2026-11-27T10:00:00.000Z", str(uuid.uuid4()).encode()]
        snapshot.send_multipart([back, b"SYNC", *event, msgpack.packb({"n": 1})])
        snapshot.send_multipart([back, b"SYNCEND", spec, b"1"])
        got = sub.next(timeout=15.0)
    assert got is not None and (got.seq, got.topic, got.data) == (1, "/nb/a", {"n": 1})
