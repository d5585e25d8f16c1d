"""The Event BUS port on a real BrokerServer (in a thread), with the test client
written from the protocol document and WIRE-NOTES (tests/eventbus_client.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import pytest
import zmq
from django.db import transaction

import emq_django as emq
from emq_django.broker.ports import eventbus as eventbus_port
from emq_django.broker.topics import MSGPACK
from emq_django.protocol import eventbus
from tests.eventbus_client import BusClient
from tests.integration import test_broker_server as base
from tests.integration.test_broker_server import Broker
from tests.support import free_tcp_ports, wait_until

start_broker = base.start_broker  # the fixture: a BrokerServer in a thread


def bus(broker: Broker, **kw: Any) -> BusClient:
    s = broker.server.settings
    return BusClient(
        s.BUS_SNAPSHOT_BIND,
        s.BUS_PUBLISH_BIND,
        s.BUS_COLLECT_BIND,
        broker.context,
        track=broker.sockets,
        **kw,
    )


def figures(broker: Broker) -> dict[str, Any]:
    """The Event BUS port's figures in the broker's status."""
    doc: dict[str, Any] = broker.status()["topics"]["ports"].get("eventbus", {})
    return doc


def last_seq(broker: Broker) -> int:
    seq: int = broker.status()["topics"]["last_seq"]
    return seq


def wait_seq(broker: Broker, n: int) -> None:
    wait_until(lambda: last_seq(broker) == n, f"{n} events")


def wait_malformed(broker: Broker, n: int) -> None:
    wait_until(lambda: figures(broker).get("malformed", 0) >= n, f"{n} malformed counted")


def subscribed(broker: Broker, n: int) -> None:
    wait_until(
        lambda: figures(broker).get("subscribers", 0) >= n,
        f"{n} subscriptions",
    )


def test_sync_then_live_updates_with_prefix_match(start_broker: Callable[..., Broker]) -> None:
    broker = start_broker()
    producer = bus(broker)
    for i in range(5):
        producer.publish(f"/orders/{i}", {"n": i})
    producer.publish("/users/1", "u")
    wait_seq(broker, 6)

    client = bus(broker)
    client.subscribe("/orders/")
    events, current = client.sync("/orders/,/none/", since=2)
    assert [(e.seq, e.topic, e.data) for e in events] == [
        (3, "/orders/2", {"n": 2}),
        (4, "/orders/3", {"n": 3}),
        (5, "/orders/4", {"n": 4}),
    ]
    assert current == 6  # the bus's current sequence, not the last SYNC's
    assert events[0].producer == "test-producer" and len(events[0].uuid) == 36
    subscribed(broker, 1)
    producer.publish("/users/2", "not for us")
    producer.publish("/orders/9", [1, 2])
    live = client.receive(10.0)
    # the broker may answer the monitor (last_seq 6) before it sends events 1-6 out
    # in the same round, so the subscription can still catch some of them: older
    # than the snapshot, a Clone client skips them
    while live is not None and live.seq <= current:
        live = client.receive(10.0)
    assert live is not None and (live.seq, live.topic, live.data) == (8, "/orders/9", [1, 2])
    assert client.receive(0.3) is None
    # the document's ';' and 8-byte sequence
    client.send_raw_snapshot([b"SYNCSTART", b"/users/;/orders/9", (6).to_bytes(8, "big")])
    frames = [client._snapshot.recv_multipart() for _ in range(3)]  # type: ignore[union-attr]
    assert [f[2] for f in frames[:2]] == [b"7", b"8"] and frames[2][0] == b"SYNCEND"
    status = broker.status()
    assert status["topics"]["topics"]["/orders/9"]["last_seq"] == 8
    assert status["topics"]["ports"]["eventbus"]["collected"] == 8
    assert status["topics"]["ports"]["eventbus"]["subscribers"] == 1
    lines = broker.ask_monitor(b"MONITOR").decode().splitlines()
    assert "topics.last_seq: 8" in lines and "topics.eventbus.subscribers: 1" in lines
    producer.close()
    client.close()
    wait_until(  # a subscriber that goes away is counted out (XPUB_VERBOSER)
        lambda: figures(broker)["subscribers"] == 0,
        "the subscription to go",
    )


def test_malformed_messages_on_all_three_sockets_are_counted(
    start_broker: Callable[..., Broker],
) -> None:
    broker = start_broker()
    s = broker.server.settings
    snapshot = broker.socket(zmq.DEALER, s.BUS_SNAPSHOT_BIND)
    collector = broker.socket(zmq.DEALER, s.BUS_COLLECT_BIND)
    xsub = broker.socket(zmq.XSUB, s.BUS_PUBLISH_BIND)
    n = 300
    for i in range(n):
        snapshot.send_multipart([b"SYNCSTART", b"", b"-%d" % i])
        collector.send_multipart([b"/t", b"", b"p", b"", b"", b"\xc1"])
        xsub.send_multipart([b"\x07garbage", b"%d" % i])
    wait_malformed(broker, 3 * n)
    status = broker.status()
    assert status["counters"]["dropped_malformed"] >= 3 * n
    assert status["topics"]["last_seq"] == 0
    good = bus(broker)
    good.publish("/t", 1)
    wait_seq(broker, 1)
    assert good.sync("/t")[1] == 1
    good.close()


def test_json_and_raw_events_reach_bus_subscribers_as_messagepack(
    start_broker: Callable[..., Broker],
) -> None:
    """Our seventh PUB frame (the content type, as emq.publish sends raw bytes or
    JSON) keeps the data as published; Event BUS subscribers get MessagePack."""
    broker = start_broker()
    client = bus(broker)
    client.subscribe("")
    subscribed(broker, 1)
    producer = bus(broker)
    base_frames = [b"/json/x", b"", b"p", b"", b""]
    producer.publish_raw([*base_frames, b'{"k": [1, 2]}', b"application/json"])
    producer.publish_raw([*base_frames, b"\x00raw", b"application/octet-stream"])
    got = client.receive_n(2, 10.0)
    assert [(e.seq, e.data) for e in got] == [(1, {"k": [1, 2]}), (2, b"\x00raw")]
    kept = list(broker.server.core.topics.since(["/json/"], 0))  # read after the commit
    assert [(e.data, e.content_type) for e in kept] == [
        (b'{"k": [1, 2]}', "application/json"),
        (b"\x00raw", "application/octet-stream"),
    ]


class Rollback(Exception):
    pass


@pytest.mark.django_db(transaction=True)
def test_publish_on_commit_publishes_after_the_commit_and_never_on_rollback(
    start_broker: Callable[..., Broker],
) -> None:
    broker = start_broker()
    s = broker.server.settings
    url = s.BUS_COLLECT_BIND
    with emq.subscribe(
        "/db/", None, snapshot_url=s.BUS_SNAPSHOT_BIND, publish_url=s.BUS_PUBLISH_BIND
    ) as sub:
        with pytest.raises(Rollback), transaction.atomic():
            assert emq.publish_on_commit("/db/rolled-back", 1, url=url) is True
            raise Rollback
        with transaction.atomic():
            assert emq.publish_on_commit("/db/committed", {"ok": True}, url=url) is True
            assert sub.next(timeout=0.5) is None  # not before the commit
        event = sub.next(timeout=10.0)
        assert event is not None and (event.topic, event.data) == ("/db/committed", {"ok": True})
        assert sub.next(timeout=0.5) is None
        with pytest.raises(ValueError):
            emq.publish_on_commit("", 1, url=url)  # refused at once, not at commit time


def test_a_long_replay_goes_out_over_several_turns_and_ends_at_the_bus_sequence(
    start_broker: Callable[..., Broker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay is sent a few SYNCs a loop turn; the client sees one answer, whose
    SYNCEND carries the bus's sequence when it asked (no pages to know of)."""
    monkeypatch.setattr(eventbus_port, "REPLAY_TURN", 3)
    monkeypatch.setattr(eventbus_port, "REPLAY_SHARE", 3)
    broker = start_broker()
    producer = bus(broker)
    for i in range(7):
        producer.publish("/page/x", i)
    producer.publish("/other/x", "not under /page/")
    wait_seq(broker, 8)
    client = bus(broker)
    events, upto = client.sync("/page/", since=0)
    assert [e.seq for e in events] == list(range(1, 8)) and upto == 8
    assert figures(broker)["replays_done"] == 1 and figures(broker)["replays"] == 0
    s = broker.server.settings
    with emq.subscribe(
        "/page/",
        0,
        snapshot_url=s.BUS_SNAPSHOT_BIND,
        publish_url=s.BUS_PUBLISH_BIND,
        idle_check=0.2,
    ) as sub:
        got = [sub.next(timeout=10.0) for _ in range(7)]
        assert [e.data for e in got if e is not None] == list(range(7))
        assert sub.next(timeout=0.5) is None


def test_batch_channels_publish_many_and_the_batch_publisher(
    start_broker: Callable[..., Broker],
) -> None:
    """emq.publish_many's publish batches and the batch publisher carry the same
    events, in the same order, as PUBs and BROADCASTs; an Event BUS client on the
    same broker sees every one of them on its wire."""
    (batch_port,) = free_tcp_ports(1)
    batch_url = f"tcp://127.0.0.1:{batch_port}"
    broker = start_broker(BUS_BATCH_BIND=batch_url)
    s = broker.server.settings
    external = bus(broker)
    external.subscribe("/many/")
    with emq.subscribe(
        "/many/", 0, snapshot_url=s.BUS_SNAPSHOT_BIND, batch_url=batch_url, idle_check=0.2
    ) as sub:
        subscribed(broker, 2)
        items: list[Any] = [{"i": i} for i in range(600)] + [b"raw", "text"]
        ids = emq.publish_many("/many/x", items, url=s.BUS_COLLECT_BIND)
        emq.publish("/other/y", 1, url=s.BUS_COLLECT_BIND)  # not under the prefix
        got = [sub.next(timeout=10.0) for _ in range(602)]
        wait_seq(broker, 603)
        external.publish("/many/z", {"from": "bus"})  # another producer: after those
        got.append(sub.next(timeout=10.0))
        assert [e.seq for e in got if e is not None] == list(range(1, 603)) + [604]
        assert [e.data for e in got if e is not None] == [*items, {"from": "bus"}]
        assert [e.uuid for e in got[:602] if e is not None] == ids
        assert sub.next(timeout=0.5) is None
    on_bus = external.receive_n(603, 20.0)
    assert [e.seq for e in on_bus] == list(range(1, 603)) + [604]
    assert on_bus[0].data == {"i": 0} and on_bus[600].data == b"raw"
    bus_figures = figures(broker)
    assert bus_figures["collected_batches"] >= 2 and bus_figures["batched_events"] == 604
    assert bus_figures["batches"] < 604  # several events a message


def test_malformed_publish_batches_are_counted_and_publish_nothing(
    start_broker: Callable[..., Broker],
) -> None:
    broker = start_broker()
    s = broker.server.settings
    collector = broker.socket(zmq.DEALER, s.BUS_COLLECT_BIND)
    n = 200
    for i in range(n):
        good = [1.0, b"", msgpack.packb(i)]
        collector.send_multipart(  # one bad event spoils the batch
            eventbus.pubs(b"/t", MSGPACK, b"p", [*good, 1.0, b"", b"\xc1"])
        )
        collector.send_multipart([b"EMQPUBS", b"/t", b"x/y", b"p", b"%d" % i])
    wait_malformed(broker, 2 * n)
    assert last_seq(broker) == 0
    emq.publish_many("/t", [1, 2], url=s.BUS_COLLECT_BIND)
    wait_seq(broker, 2)
    with pytest.raises(ValueError):
        emq.publish_many("", [1], url=s.BUS_COLLECT_BIND)  # a bad topic: nothing sent


def test_publish_carries_text_and_refuses_what_the_bus_cannot_carry(
    start_broker: Callable[..., Broker],
) -> None:
    """Issue 30, item 7: text is accepted (str, or UTF-8 bytes, under any ``text/``
    type) and reaches subscribers and the broker's store as text; a content type
    the Event BUS cannot carry is refused at the call, with the reason, and
    nothing is published."""
    broker = start_broker()
    s = broker.server.settings
    urls = {"url": s.BUS_COLLECT_BIND}
    for content_type, data in (("image/png", b"\x89PNG"), ("application/x-custom", b"x")):
        with pytest.raises(ValueError, match=content_type):
            emq.publish("/text/refused", data, content_type=content_type, **urls)
    with pytest.raises(ValueError, match="UTF-8"):
        emq.publish("/text/refused", b"\xff\xfe", content_type="text/plain", **urls)
    emq.publish("/text/a", b"plain words", content_type="text/plain", **urls)
    emq.publish("/text/a", "<p>caf\u00e9</p>", content_type="text/html; charset=utf-8", **urls)
    wait_seq(broker, 2)
    with emq.subscribe(
        "/text/", since=0, snapshot_url=s.BUS_SNAPSHOT_BIND, publish_url=s.BUS_PUBLISH_BIND
    ) as sub:
        got = [sub.next(timeout=10.0) for _ in range(2)]
    assert [e.data if e else None for e in got] == ["plain words", "<p>caf\u00e9</p>"]
    assert figures(broker).get("malformed", 0) == 0


def test_a_confirmed_publish_batch_is_answered_after_the_commit_or_refused_with_its_reason(
    start_broker: Callable[..., Broker],
) -> None:
    """emq's confirmed publish batches: PUBOK up to the last batch id once the
    events are numbered and journaled; a malformed one gets PUBNO with the reason,
    which ``publish`` raises as ``PublishUnconfirmed`` (nothing refused in silence)."""
    from emq_django.publish_confirm import Unconfirmed

    broker = start_broker()
    s = broker.server.settings
    collector = broker.socket(zmq.DEALER, s.BUS_COLLECT_BIND)
    good = [1.0, b"", msgpack.packb(1)]
    collector.send_multipart(eventbus.confirmed_pubs(1, b"/c/x", MSGPACK, b"p", good * 2))
    collector.send_multipart(eventbus.confirmed_pubs(2, b"/c/x", MSGPACK, b"p", good))
    answers = []
    while not answers or answers[-1].last < 2:
        assert collector.poll(10_000), "no confirmation"
        answers.append(eventbus.decode_confirmation(collector.recv_multipart()))
    assert all(a.ok for a in answers) and last_seq(broker) == 3  # committed before the answer
    pending = Unconfirmed()
    pending.sent(1)
    bad = eventbus.confirmed_pubs(pending.last_id, b"/c/x", MSGPACK, b"p", [1.0, b"", b"\xc1"])
    collector.send_multipart(bad)
    with pytest.raises(emq.PublishUnconfirmed, match="not MessagePack") as raised:
        pending.wait(collector, 0, 10.0)
    assert raised.value.count == 1 and last_seq(broker) == 3
