"""The Topics page's payload decoding: MessagePack and JSON by content type, text,
hex, and mislabelled payloads shown raw with a note instead of failing the page."""

from __future__ import annotations

import json

import msgpack

from emq_django.results.topic_data import MAX_SHOWN, decode


def test_msgpack_becomes_json_text() -> None:
    data = msgpack.packb({"order": 7, "items": [1, 2], b"raw": b"\xff\x00", 3: "three"})
    shown = decode(data, "application/msgpack")
    assert shown["as"] == "msgpack" and shown["note"] == ""
    assert json.loads(shown["text"]) == {"order": 7, "items": [1, 2], "raw": "0xff00", "3": "three"}


def test_json_is_shown_compact_and_text_stays_text() -> None:
    shown = decode('{"a":[1,{"b":null}],"é":1}'.encode(), "application/json; charset=utf-8")
    assert shown["as"] == "json" and shown["text"] == '{"a": [1, {"b": null}], "é": 1}'
    assert decode("héllo\nworld".encode(), "text/plain") == {
        "as": "text",
        "text": "héllo\nworld",
        "note": "",
    }


def test_binary_is_hex_and_a_wrong_label_is_noted() -> None:
    assert decode(b"\x00\x01\xfe", "application/octet-stream")["text"] == "00 01 fe"
    wrong = decode(b"\xc1", "application/msgpack")  # 0xc1 is never used in MessagePack
    assert wrong["as"] == "hex" and wrong["note"].startswith("not MessagePack")
    bad_json = decode(b"{not json", "application/json")
    assert bad_json["as"] == "text" and bad_json["note"].startswith("not JSON")


def test_long_data_is_cut() -> None:
    shown = decode(b"x" * (MAX_SHOWN * 2), "text/plain")
    assert len(shown["text"]) < MAX_SHOWN + 40 and shown["text"].endswith("characters)")
