"""The mc0 port's sessions without sockets: a real BrokerCore, the port's
``handle`` and timers driven with explicit clock values (the port touches no
socket; the server sends what these return). The wire end to end is
tests/e2e/test_mc0.py."""

from __future__ import annotations

from emq_django.broker.core import BrokerConfig, BrokerCore
from emq_django.broker.effects import Published
from emq_django.broker.ports.mc0 import Mc0Port

A, B = b"\x00conn-a", b"\x00conn-b"


def port() -> Mc0Port:
    return Mc0Port(BrokerCore(BrokerConfig(), now=0.0), "tcp://127.0.0.1:1")


def connect(p: Mc0Port, identity: bytes, ttl_ms: int = 1000, now: float = 0.0) -> list[bytes]:
    frames = [b"", b"CONNECT", b"VERSION", b"0.2", b"TTL", str(ttl_ms).encode(), b"ID", b"c"]
    answer = p.handle(identity, frames, now)
    assert answer is not None
    return answer


def test_connect_sub_unsub_answer_ok_with_the_id() -> None:
    p = port()
    assert connect(p, A) == [b"", b"OK", b"ID", b"c"]
    assert p.handle(A, [b"", b"SUB", b"ID", b"s1", b"", b"t1", b"t2"], 0.1) == [
        b"",
        b"OK",
        b"ID",
        b"s1",
    ]
    assert p.sessions[A].topics == {"t1", "t2"}
    assert p.subscriber_count() == 1
    assert p.topic_stats() == {"sessions": 1, "topics": 2, "subscriptions": 2}
    assert p.handle(A, [b"", b"UNSUB", b"ID", b"u1", b"", b"t1"], 0.2) == [
        b"",
        b"OK",
        b"ID",
        b"u1",
    ]
    assert set(p.subscribers) == {"t2"}
    assert p.handle(A, [b"", b"NOOP"], 0.3) is None  # no ID: no answer
    assert p.core.counters["mc0_connects"] == 1


def test_commands_before_connect_get_an_error() -> None:
    p = port()
    answer = p.handle(A, [b"", b"SUB", b"ID", b"9", b"", b"t"], 0.0)
    assert answer is not None and answer[:4] == [b"", b"ERROR", b"ID", b"9"]
    assert b"CONNECT first" in answer[-1]
    assert p.handle(A, [b"", b"NOOP", b"ID", b"n"], 0.0) == [
        b"",
        b"ERROR",
        b"ID",
        b"n",
        b"MESSAGE",
        b"NOOP before CONNECT (or after an eviction): CONNECT first",
    ]
    # without an ID nobody waits for an answer: none, as mc0d (issue 30 item 8)
    assert p.handle(A, [b"", b"NOOP"], 0.0) is None
    assert p.handle(A, [b"", b"PUT", b"TOPIC", b"t", b"", b"body"], 0.0) is None
    assert p.core.counters["mc0_unanswered"] == 2
    assert p.core.counters["mc0_errors"] == 2
    assert p.core.counters["protocol_errors"] == 2
    assert not p.sessions


def test_odd_headers_and_unknown_verbs_get_an_error_and_leave_the_session() -> None:
    p = port()
    connect(p, A)
    p.handle(A, [b"", b"SUB", b"ID", b"1", b"", b"t"], 0.0)
    odd = p.handle(A, [b"", b"PUT", b"TOPIC", b"t", b"X-odd", b"", b"body"], 0.1)
    assert odd is not None and odd[1] == b"ERROR" and b"odd number" in odd[-1]
    unknown = p.handle(A, [b"", b"PING", b"ID", b"2"], 0.1)
    assert unknown == [b"", b"ERROR", b"ID", b"2", b"MESSAGE", b"unknown verb 'PING'"]
    assert p.sessions[A].topics == {"t"}
    assert p.core.counters["protocol_errors"] == 2


def test_noop_at_095_ttl_of_silence_and_eviction_after_105_ttl() -> None:
    p = port()
    connect(p, A, ttl_ms=1000, now=0.0)
    assert p.next_timer() == 0.95
    assert p.on_timer(0.94) == []
    assert p.on_timer(0.95) == [("mc0", [A, b"", b"NOOP"])]
    # heard from just before: it stays; the next NOOP is due 0.95 s after the last
    p.handle(A, [b"", b"NOOP"], 1.0)
    assert p.on_timer(1.5) == []
    assert A in p.sessions
    assert p.on_timer(1.9) == [("mc0", [A, b"", b"NOOP"])]
    # silent from 1.0: still there at 2.049, gone at 2.05
    p.on_timer(2.049)
    assert A in p.sessions
    p.on_timer(2.05)
    assert A not in p.sessions
    assert p.core.counters["mc0_evicted"] == 1
    assert p.next_timer() is None


def test_traffic_to_a_session_postpones_its_noop() -> None:
    p = port()
    connect(p, A, ttl_ms=1000, now=0.0)
    p.handle(A, [b"", b"NOOP", b"ID", b"n"], 0.5)  # answered: sent to at 0.5
    assert p.on_timer(0.95) == []
    assert p.on_timer(1.45) == [("mc0", [A, b"", b"NOOP"])]


def test_disconnect_and_reconnect_drop_the_subscriptions() -> None:
    p = port()
    connect(p, A)
    connect(p, B)
    p.handle(A, [b"", b"SUB", b"", b"t"], 0.0)
    p.handle(B, [b"", b"SUB", b"", b"t"], 0.0)
    assert p.topic_stats()["subscriptions"] == 2
    assert p.handle(A, [b"", b"DISCONNECT"], 0.1) is None
    assert A not in p.sessions
    assert p.topic_stats()["subscriptions"] == 1
    connect(p, B, now=0.2)  # a CONNECT again starts afresh
    assert p.topic_stats() == {"sessions": 1, "topics": 0, "subscriptions": 0}
    assert p.core.counters["mc0_disconnects"] == 1
    # the old sessions' timers are skipped, the new one's kept
    assert p.on_timer(1.14) == []
    assert p.on_timer(1.15) == [("mc0", [B, b"", b"NOOP"])]


def test_a_gone_peer_loses_its_session() -> None:
    p = port()
    connect(p, A)
    p.handle(A, [b"", b"SUB", b"", b"t"], 0.0)
    p.unroutable(A, 0.5)
    assert not p.sessions and not p.subscribers


def test_put_publishes_into_the_topic_space_and_reaches_exact_subscribers() -> None:
    p = port()
    for identity in (A, B):
        connect(p, identity)
    p.handle(A, [b"", b"SUB", b"", b"orders"], 0.0)
    p.handle(B, [b"", b"SUB", b"", b"orders.eu"], 0.0)  # exact match: not "orders"
    put = [b"", b"PUT", b"TOPIC", b"orders", b"ID", b"p1", b"X-Reply-To", b"me", b"", b"body"]
    assert p.handle(B, put, 0.1) == [b"", b"OK", b"ID", b"p1"]
    published = [e for e in p.core.out if type(e) is Published]
    assert len(published) == 1
    event = published[0].event
    assert (event.topic, event.data, event.headers) == ("orders", b"body", (("X-Reply-To", "me"),))
    assert event.content_type == "application/octet-stream"
    assert event.seq == p.core.topics.last_seq == 1
    assert p.on_published(event) == [
        ("mc0", [A, b"", b"MESSAGE", b"TOPIC", b"orders", b"X-Reply-To", b"me", b"", b"body"])
    ]
    assert p.core.counters["mc0_puts"] == 1
    assert p.core.counters["mc0_messages_sent"] == 1


def test_a_bad_put_is_refused_and_publishes_nothing() -> None:
    p = port()
    connect(p, A)
    answer = p.handle(A, [b"", b"PUT", b"TOPIC", b"t", b"ID", b"p2"], 0.1)  # no body
    assert answer is not None and answer[:4] == [b"", b"ERROR", b"ID", b"p2"]
    assert not [e for e in p.core.out if type(e) is Published]
    assert p.core.topics.last_seq == 0


def test_a_key_that_lost_subscriber_loses_its_subs_and_a_revoked_one_its_session() -> None:
    """What the CURVE guard asks after a key reload (issue 30 item 6)."""
    p = port()
    for identity in (A, B):
        connect(p, identity)
        assert p.handle(identity, [b"", b"SUB", b"ID", b"s", b"", b"t"], 0.1) is not None
    p.narrow(A, frozenset({"publisher"}), 0.2)  # publisher still: the session stays
    assert A in p.sessions and not p.sessions[A].topics
    assert set(p.subscribers["t"]) == {B}
    assert p.revoke(B, 0.3) and B not in p.sessions and "t" not in p.subscribers
    assert not p.revoke(B, 0.4)  # no session left
