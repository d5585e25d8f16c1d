"""The mc0 codec (emq_django/protocol/mc0.py) against the document's and
WIRE-NOTES' examples, and the malformed messages it must refuse with a reason."""

from __future__ import annotations

import pytest

from emq_django.protocol import mc0
from emq_django.protocol.mc0 import Mc0Error


def test_connect_as_the_connector_sends_it() -> None:
    frames = [b"", b"CONNECT", b"VERSION", b"0.2", b"TTL", b"30000", b"ID", b"7"]
    cmd = mc0.decode(frames)
    assert cmd.verb == b"CONNECT"
    assert cmd.msg_id == b"7"
    assert cmd.positional == ()
    params = mc0.connect_params(cmd)
    assert params.version == b"0.2"
    assert params.ttl == 30.0


@pytest.mark.parametrize("version", [b"0.2", b"0.3"])
def test_both_versions_are_accepted(version: bytes) -> None:
    cmd = mc0.decode([b"", b"CONNECT", b"VERSION", version, b"TTL", b"1000"])
    assert mc0.connect_params(cmd).version == version


@pytest.mark.parametrize(
    ("headers", "why"),
    [
        ([b"VERSION", b"0.1", b"TTL", b"1000"], "VERSION"),
        ([b"TTL", b"1000"], "VERSION"),
        ([b"VERSION", b"0.2"], "TTL"),
        ([b"VERSION", b"0.2", b"TTL", b"soon"], "TTL"),
        ([b"VERSION", b"0.2", b"TTL", b"0"], "out of range"),
        ([b"VERSION", b"0.2", b"TTL", b"-5"], "out of range"),
    ],
)
def test_bad_connect_parameters(headers: list[bytes], why: str) -> None:
    cmd = mc0.decode([b"", b"CONNECT", *headers, b"ID", b"c1"])
    with pytest.raises(Mc0Error, match=why) as info:
        mc0.connect_params(cmd)
    assert info.value.msg_id == b"c1"


def test_sub_and_unsub_topics_are_positional() -> None:
    cmd = mc0.decode([b"", b"SUB", b"ID", b"2", b"", b"topic1", b"topic2"])
    assert cmd.verb == b"SUB"
    assert mc0.topics(cmd) == ["topic1", "topic2"]
    cmd = mc0.decode([b"", b"UNSUB", b"", b"topic1"])
    assert mc0.topics(cmd) == ["topic1"]
    assert cmd.msg_id == b""


def test_put_topic_body_and_forwarded_headers() -> None:
    frames = [b"", b"PUT", b"TOPIC", b"t1", b"ID", b"9", b"X-Reply", b"r", b"", b"\x00body"]
    cmd = mc0.decode(frames)
    assert mc0.put_topic(cmd) == ("t1", b"\x00body")
    assert mc0.forwarded_headers(cmd) == (("X-Reply", "r"),)


@pytest.mark.parametrize(
    ("frames", "why"),
    [
        ([b"", b"PUT", b"", b"body"], "TOPIC"),
        ([b"", b"PUT", b"TOPIC", b"t"], "one body frame"),
        ([b"", b"PUT", b"TOPIC", b"t", b"", b"a", b"b"], "one body frame"),
        ([b"", b"PUT", b"TOPIC", b"\xff\xfe", b"", b"a"], "UTF-8"),
        ([b"", b"PUT", b"TOPIC", b"x" * 256, b"", b"a"], "over 255"),
    ],
)
def test_bad_puts(frames: list[bytes], why: str) -> None:
    with pytest.raises(Mc0Error, match=why):
        mc0.put_topic(mc0.decode(frames))


@pytest.mark.parametrize(
    ("frames", "why"),
    [
        ([], "empty message"),
        ([b"CONNECT", b"VERSION", b"0.2"], "start with an empty frame"),
        ([b""], "no verb"),
        ([b"", b""], "no verb"),
        ([b"", b"FROB"], "unknown verb"),
        ([b"", b"PUT", b"TOPIC"], "odd number of header frames"),
        ([b"", b"SUB", b"ID", b"3", b"X", b"", b"t"], "odd number of header frames"),
        ([b"", b"CONNECT", b"ID", b"x" * 256], "ID is over"),
        ([b"", b"NOOP", *[b"X-k", b"v"] * 65], "more than 64 headers"),
    ],
)
def test_malformed_messages_are_refused_with_a_reason(frames: list[bytes], why: str) -> None:
    with pytest.raises(Mc0Error, match=why):
        mc0.decode(frames)


def test_an_error_keeps_the_id_when_the_headers_had_one() -> None:
    with pytest.raises(Mc0Error) as info:
        mc0.decode([b"", b"FROB", b"ID", b"42"])
    assert info.value.msg_id == b"42"
    with pytest.raises(Mc0Error) as info:
        mc0.decode([b"", b"SUB", b"ID", b"43", b"stray", b"", b"t"])
    assert info.value.msg_id == b"43"  # the pairs before the odd frame still give it


def test_what_the_broker_sends() -> None:
    assert mc0.ok(b"5") == [b"", b"OK", b"ID", b"5"]
    assert mc0.noop() == [b"", b"NOOP"]
    assert mc0.error("bad", b"5") == [b"", b"ERROR", b"ID", b"5", b"MESSAGE", b"bad"]
    assert mc0.error("bad") == [b"", b"ERROR", b"MESSAGE", b"bad"]
    assert mc0.message("t", b"body", (("X-A", "1"), ("ID", "no"), ("E", ""))) == [
        b"",
        b"MESSAGE",
        b"TOPIC",
        b"t",
        b"X-A",
        b"1",
        b"",
        b"body",
    ]


def test_a_message_decodes_back() -> None:
    frames = mc0.message("news", b"", (("X-From", "me"),))
    cmd = mc0.decode([b"", b"PUT", *frames[2:]])  # same layout but a client verb
    assert mc0.put_topic(cmd) == ("news", b"")
    assert mc0.forwarded_headers(cmd) == (("X-From", "me"),)
    assert mc0.command(b"SUB", [(b"ID", b"1")], b"a", b"b") == [
        b"",
        b"SUB",
        b"ID",
        b"1",
        b"",
        b"a",
        b"b",
    ]
