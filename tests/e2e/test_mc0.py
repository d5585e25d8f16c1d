"""The mc0 port end to end: a connector written here from the document and
WIRE-NOTES (tests/mc0_client.py, plain pyzmq) against a real broker process on
private ports: CONNECT/SUB/UNSUB answered OK, PUT fanned out as MESSAGE to exact
subscribers, the broker's NOOPs at 0.95 x TTL, eviction after 1.05 x TTL,
DISCONNECT, ERROR for malformed commands, and 10,000 malformed messages; and the
one topic space: an mc0 PUT reaches Event BUS clients (tests/eventbus_client.py)
and ``emq.subscribe``, and Event BUS events and ``emq.publish`` reach mc0
subscribers."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import zmq

import emq_django as emq
from tests.e2e.test_spine import monitor
from tests.eventbus_client import BusClient
from tests.mc0_client import Mc0Client, Mc0Refused
from tests.support import EmqProcesses, ManagedProcess, port_of, start_broker, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

_open: list[Mc0Client] = []


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    while _open:
        _open.pop().close()
    context.destroy(linger=0)


def bus_subscribers(env: dict[str, str]) -> int:
    ports = monitor(env).get("topics", {}).get("ports", {})
    return int(ports.get("eventbus", {}).get("subscribers", 0))


def start_mc0_broker(
    procs: EmqProcesses, env: dict[str, str], name: str = "broker", **extra: str
) -> ManagedProcess:
    proc = start_broker(procs, env, name=name, extra_env=extra)
    procs.wait_for_port(port_of(env["EMQ_MC0_BIND"]), proc=proc)
    return proc


def client(ctx: zmq.Context[Any], env: dict[str, str], **kwargs: Any) -> Mc0Client:
    c = Mc0Client(ctx, env["EMQ_MC0_BIND"], **kwargs)
    _open.append(c)
    return c


def counters(env: dict[str, str]) -> dict[str, int]:
    return monitor(env)["counters"]


# ---- tests --------------------------------------------------------------------------


def test_connect_sub_unsub_are_answered_ok_with_their_ids(
    emq_processes: EmqProcesses, emq_env: dict[str, str], ctx: zmq.Context[Any]
) -> None:
    start_mc0_broker(emq_processes, emq_env)
    c = client(ctx, emq_env)
    for version in (b"0.2", b"0.3"):
        c.connect(ttl_ms=30_000, version=version)
    c.sub("alpha", "beta")
    c.unsub("alpha")
    ok = c.request(b"NOOP", [])  # any command with an ID is answered
    assert ok.verb == b"OK" and ok.header(b"ID") is not None
    with pytest.raises(Mc0Refused, match="VERSION"):
        c.connect(version=b"0.1")
    assert counters(emq_env)["mc0_connects"] == 2


def test_put_reaches_exact_subscribers_as_message_with_its_headers(
    emq_processes: EmqProcesses, emq_env: dict[str, str], ctx: zmq.Context[Any]
) -> None:
    start_mc0_broker(emq_processes, emq_env)
    sub1, sub2, other, producer = (client(ctx, emq_env) for _ in range(4))
    for c in (sub1, sub2, other, producer):
        c.connect()
    sub1.sub("mcollective.discovery")
    sub2.sub("mcollective.discovery", "mcollective.rpc")
    other.sub("mcollective")  # exact match only: no prefix
    producer.put("mcollective.discovery", b"\x00\x01ping", [(b"X-Reply-To", b"r1")])
    ok = producer.request(b"PUT", [(b"TOPIC", b"mcollective.rpc")], b"rpc body")
    assert ok.verb == b"OK"  # a PUT with an ID is answered too
    (m1,) = sub1.messages(1)
    head = [b"", b"MESSAGE", b"TOPIC", b"mcollective.discovery"]
    assert m1.raw == [*head, b"X-Reply-To", b"r1", b"", b"\x00\x01ping"]
    got = sub2.messages(2)
    assert [(m.header(b"TOPIC"), m.positional) for m in got] == [
        (b"mcollective.discovery", [b"\x00\x01ping"]),
        (b"mcollective.rpc", [b"rpc body"]),
    ]
    assert all(m.header(b"ID") is None for m in got)  # every header but ID
    assert other.recv(timeout=0.5, verb=b"MESSAGE") is None
    assert producer.recv(timeout=0.1, verb=b"MESSAGE") is None  # not subscribed
    sub2.unsub("mcollective.rpc")
    producer.put("mcollective.rpc", b"after unsub")
    producer.put("mcollective.discovery", b"marker")
    (marker,) = sub2.messages(1)
    assert marker.positional == [b"marker"]
    doc = counters(emq_env)
    assert doc["mc0_puts"] == 4
    assert doc["mc0_messages_sent"] == 5


def test_broker_sends_noop_every_095_ttl_to_a_live_connector(
    emq_processes: EmqProcesses, emq_env: dict[str, str], ctx: zmq.Context[Any]
) -> None:
    start_mc0_broker(emq_processes, emq_env)
    ttl = 1.0
    c = client(ctx, emq_env)
    c.connect(ttl_ms=int(ttl * 1000))
    connected = time.monotonic()
    noops: list[float] = []
    deadline = connected + 4.5 * ttl
    next_noop = connected
    while time.monotonic() < deadline:
        if time.monotonic() >= next_noop:
            c.noop()  # as the connector does: it stays alive, unanswered
            next_noop += 0.3 * ttl
        got = c.recv(timeout=0.05)
        if got is not None:
            assert got.verb == b"NOOP", got
            assert got.raw == [b"", b"NOOP"]
            noops.append(got.at)
    gaps = [b - a for a, b in zip([connected, *noops], noops, strict=False)]
    print(f"mc0 NOOP gaps at TTL {ttl} s: {[round(g, 3) for g in gaps]}")
    assert len(noops) >= 3, gaps
    # never early: 0.95 x TTL, not (say) half of it; the margin is for this
    # process being descheduled while it reads on a shared machine
    assert min(gaps) >= 0.8 * ttl, gaps
    assert counters(emq_env)["mc0_evicted"] == 0


def test_a_silent_connector_is_evicted_after_105_ttl(
    emq_processes: EmqProcesses, emq_env: dict[str, str], ctx: zmq.Context[Any]
) -> None:
    start_mc0_broker(emq_processes, emq_env)
    ttl = 0.5
    silent = client(ctx, emq_env)
    silent.connect(ttl_ms=int(ttl * 1000))
    connected = time.monotonic()
    silent.sub("news")
    talker = client(ctx, emq_env)
    talker.connect(ttl_ms=30_000)
    talker.sub("news")
    wait_until(lambda: counters(emq_env)["mc0_evicted"] == 1, "the eviction", timeout=30)
    evicted_by = time.monotonic() - connected
    assert evicted_by >= 1.05 * ttl  # not before
    print(f"mc0 eviction seen {evicted_by:.3f} s after CONNECT (TTL {ttl} s)")
    talker.put("news", b"after the eviction")
    (seen,) = talker.messages(1)  # published and fanned out ...
    assert seen.positional == [b"after the eviction"]
    got = silent.recv(timeout=0.5)
    assert got is None or got.verb == b"NOOP"  # ... but not to the evicted one
    assert silent.recv(timeout=0.1, verb=b"MESSAGE") is None
    # its session is gone: anything but CONNECT is refused
    with pytest.raises(Mc0Refused, match="CONNECT first"):
        silent.sub("news")
    silent.connect(ttl_ms=30_000)  # and it may come back
    silent.sub("news")


def test_disconnect_ends_the_session(
    emq_processes: EmqProcesses, emq_env: dict[str, str], ctx: zmq.Context[Any]
) -> None:
    start_mc0_broker(emq_processes, emq_env)
    c = client(ctx, emq_env)
    c.connect()
    c.sub("t")
    c.disconnect()
    with pytest.raises(Mc0Refused, match="CONNECT first"):
        c.request(b"NOOP", [])
    doc = counters(emq_env)
    assert doc["mc0_disconnects"] == 1
    assert doc["mc0_evicted"] == 0


def test_odd_header_frames_and_unknown_verbs_get_error(
    emq_processes: EmqProcesses, emq_env: dict[str, str], ctx: zmq.Context[Any]
) -> None:
    broker = start_mc0_broker(emq_processes, emq_env)
    c = client(ctx, emq_env)
    c.connect()
    c.send_raw([b"", b"SUB", b"ID", b"o1", b"stray", b"", b"t"])
    got = c.recv()
    assert got is not None and got.verb == b"ERROR" and got.header(b"ID") == b"o1"
    assert b"odd number of header frames" in (got.header(b"MESSAGE") or b"")
    c.send_raw([b"", b"PUT", b"TOPIC"])  # the frame that crashed the reference broker
    got = c.recv()
    assert got is not None and got.verb == b"ERROR"
    assert b"odd number" in (got.header(b"MESSAGE") or b"")
    c.send_raw([b"", b"SUBSCRIBE", b"ID", b"u1", b"", b"t"])
    got = c.recv()
    assert got is not None and got.verb == b"ERROR" and got.header(b"ID") == b"u1"
    assert b"unknown verb" in (got.header(b"MESSAGE") or b"")
    c.send_raw([b"CONNECT", b"VERSION", b"0.2"])  # no leading empty frame
    got = c.recv()
    assert got is not None and got.verb == b"ERROR"
    assert b"empty frame" in (got.header(b"MESSAGE") or b"")
    c.sub("t")  # the session is untouched
    assert broker.alive()
    assert counters(emq_env)["mc0_errors"] == 4


def test_10000_malformed_messages_are_answered_and_counted(
    emq_processes: EmqProcesses, emq_env: dict[str, str], ctx: zmq.Context[Any]
) -> None:
    broker = start_mc0_broker(emq_processes, emq_env)
    rng = random.Random(14)
    shapes = [
        lambda: [b"", b"PUT", b"TOPIC"],  # odd headers
        lambda: [b"", b"NOPE", b"ID", b"%d" % rng.randrange(10**6)],  # unknown verb
        lambda: [b"", b"SUB", b"", b"t"],  # before CONNECT
        lambda: [b"", b"CONNECT", b"VERSION", b"9.9", b"TTL", b"1"],  # bad version
        lambda: [b"", b"CONNECT", b"VERSION", b"0.2", b"TTL", b"x"],  # bad TTL
        lambda: [rng.randbytes(rng.randrange(1, 40))],  # noise
        lambda: [b"", b""],  # no verb
        lambda: [b"", b"PUT", b"ID", b"x" * 300],  # ID too long
    ]
    noisy = client(ctx, emq_env)
    for i in range(10_000):
        noisy.send_raw(shapes[i % len(shapes)]())
    errors = 0
    while errors < 10_000:
        frames = noisy.sock.recv_multipart() if noisy.sock.poll(10_000) else None
        assert frames is not None, f"{errors} ERRORs of 10,000"
        assert frames[:2] == [b"", b"ERROR"], frames
        errors += 1
    doc = counters(emq_env)
    assert doc["mc0_errors"] == 10_000
    assert doc["protocol_errors"] == 10_000
    assert broker.alive()
    good = client(ctx, emq_env)  # and it still serves
    good.connect()
    good.sub("t")


# ---- the one topic space: mc0 <-> Event BUS -----------------------------------------


@pytest.fixture
def bus(ctx: zmq.Context[Any], emq_env: dict[str, str]) -> Iterator[BusClient]:
    track: list[zmq.Socket[Any]] = []
    client = BusClient(
        emq_env["EMQ_BUS_SNAPSHOT_BIND"],
        emq_env["EMQ_BUS_PUBLISH_BIND"],
        emq_env["EMQ_BUS_COLLECT_BIND"],
        context=ctx,
        track=track,
    )
    yield client
    for sock in track:
        sock.close(linger=0)


def test_an_mc0_put_reaches_event_bus_subscribers_and_snapshots(
    emq_processes: EmqProcesses, emq_env: dict[str, str], ctx: zmq.Context[Any], bus: BusClient
) -> None:
    start_mc0_broker(emq_processes, emq_env)
    bus.subscribe("/orders/")
    wait_until(lambda: bus_subscribers(emq_env) >= 1, "the bus subscription to arrive")
    producer = client(ctx, emq_env)
    producer.connect()
    producer.request(b"PUT", [(b"TOPIC", b"/orders/42"), (b"X-From", b"mc0")], b"\x01raw")
    event = bus.receive(timeout=10)
    assert event is not None
    assert (event.topic, event.data) == ("/orders/42", b"\x01raw")  # opaque bytes: a bin
    assert event.producer.startswith("mc0:")
    assert event.seq >= 1
    events, last = bus.sync("/orders/")  # kept in the topic space too
    assert [(e.topic, e.seq, e.data) for e in events] == [("/orders/42", event.seq, b"\x01raw")]
    assert last == event.seq


def test_an_event_bus_event_reaches_mc0_subscribers_of_its_exact_topic(
    emq_processes: EmqProcesses, emq_env: dict[str, str], ctx: zmq.Context[Any], bus: BusClient
) -> None:
    start_mc0_broker(emq_processes, emq_env)
    exact, prefix = client(ctx, emq_env), client(ctx, emq_env)
    for c in (exact, prefix):
        c.connect()
    exact.sub("/orders/42")
    prefix.sub("/orders/")  # mc0 topics match exactly: no prefix subtree
    bus.publish("/orders/42", {"qty": 3})
    (got,) = exact.messages(1)
    assert got.header(b"TOPIC") == b"/orders/42"
    assert msgpack.unpackb(got.positional[0]) == {"qty": 3}  # the bus's MessagePack as is
    assert prefix.recv(timeout=0.5, verb=b"MESSAGE") is None
    assert counters(emq_env)["mc0_messages_sent"] == 1


def test_emq_publish_reaches_an_mc0_subscriber_and_an_mc0_put_reaches_emq_subscribe(
    emq_client_env: dict[str, str], emq_processes: EmqProcesses, ctx: zmq.Context[Any]
) -> None:
    env = emq_client_env
    start_mc0_broker(emq_processes, env)
    node = client(ctx, env)
    node.connect()
    node.sub("/jobs/done")
    emq.publish("/jobs/done", b"\x00raw bytes")  # application/octet-stream
    emq.publish("/jobs/done", {"job": 7})  # MessagePack
    emq.publish("/jobs/other", {"job": 8})  # not this topic
    got = node.messages(2)
    assert [m.positional[0] for m in got] == [b"\x00raw bytes", msgpack.packb({"job": 7})]
    assert node.recv(timeout=0.5, verb=b"MESSAGE") is None

    node.put("/jobs/done", b"from mc0", [(b"X-Node", b"n1")])  # before the subscription:
    with emq.subscribe("/jobs/", since=0) as sub:  # kept, so replayed
        seen = [sub.next(timeout=30) for _ in range(4)]
        node.put("/jobs/done", b"live from mc0")  # and live
        seen.append(sub.next(timeout=30))
    assert all(e is not None for e in seen), seen
    assert [(e.topic, e.data) for e in seen if e is not None] == [
        ("/jobs/done", b"\x00raw bytes"),
        ("/jobs/done", {"job": 7}),
        ("/jobs/other", {"job": 8}),
        ("/jobs/done", b"from mc0"),
        ("/jobs/done", b"live from mc0"),
    ]
    mc0_events = [e for e in seen if e is not None and e.producer.startswith("mc0:")]
    assert len(mc0_events) == 2
    assert [e.seq for e in seen if e is not None] == [1, 2, 3, 4, 5]


# ---- the released connector's watchdog after an eviction ------------------------------


def released_connector_loop(
    node: Mc0Client, heartbeat: float, topic: str, talker: Mc0Client, limit: float
) -> tuple[int, int]:
    """Runs ``node`` as the released connector does (puppetlabs/mcollective-zeromq-
    connector in MCollective 2.12.5, WIRE-NOTES): any message from the broker is
    proof of life; it sends NOOP after 0.95 x heartbeat of its own silence and
    reconnects (CONNECT, SUB again) after 1.05 x heartbeat without input. The
    ``talker`` PUTs a ping on ``topic`` every heartbeat, as ``mco ping`` would.
    Returns (reconnects, ERRORs seen) once a ping reaches ``node``; raises
    AssertionError when none has after ``limit`` seconds."""
    start = last_in = last_out = last_ping = time.monotonic()
    reconnects = errors = 0
    while (now := time.monotonic()) - start < limit:
        if now - last_ping >= heartbeat:
            talker.put(topic, b"ping")
            last_ping = now
        if now - last_out >= 0.95 * heartbeat:
            node.noop()
            last_out = now
        if now - last_in >= 1.05 * heartbeat:
            node.connect(ttl_ms=int(heartbeat * 1000))
            node.sub(topic)
            reconnects += 1
            last_in = last_out = time.monotonic()
        got = node.recv(timeout=0.05)
        if got is None:
            continue
        last_in = time.monotonic()
        errors += got.verb == b"ERROR"
        if got.verb == b"MESSAGE":
            return reconnects, errors
    raise AssertionError(
        f"no ping in {limit} s: {reconnects} reconnects, {errors} ERRORs (deaf for good)"
    )


def test_an_evicted_connector_reconnects_and_hears_again(
    emq_processes: EmqProcesses, emq_env: dict[str, str], ctx: zmq.Context[Any]
) -> None:
    """Issue 30, item 8: a connector evicted after a one-way stall of its link (it
    sent nothing; the broker's NOOPs still reached it) is not answered any more
    until it connects again, as mc0d does with a client it forgot, so the released
    connector's watchdog fires and it reconnects, and hears pings again."""
    start_mc0_broker(emq_processes, emq_env)
    heartbeat = 0.5
    node = client(ctx, emq_env)
    node.connect(ttl_ms=int(heartbeat * 1000))
    node.sub("ping")
    talker = client(ctx, emq_env)
    talker.connect(ttl_ms=30_000)
    talker.sub("ping")
    wait_until(lambda: counters(emq_env)["mc0_evicted"] == 1, "the eviction", timeout=30)
    reconnects, errors = released_connector_loop(node, heartbeat, "ping", talker, limit=20.0)
    assert reconnects >= 1 and errors == 0
    assert counters(emq_env)["mc0_unanswered"] >= 1  # its NOOPs, counted
