"""Job and message ids (emq_django/ids.py): unguessable, unique, fresh after fork,
and valid wherever a protocol reads an id."""

from __future__ import annotations

import os
import re
import string

from emq_django.ids import BLOCK_IDS, ID_CHARS, IdGenerator, random_id
from emq_django.protocol import frames as F
from emq_django.protocol import mdp, pzq
from emq_django.protocol.headers import format_headers

HEX_ID = re.compile(rb"[0-9a-f]{32}")


def test_ids_are_128_bit_hex_and_unique_across_many_blocks() -> None:
    gen = IdGenerator()
    ids = [gen() for _ in range(BLOCK_IDS * 40 + 7)]
    assert all(HEX_ID.fullmatch(i) for i in ids)
    assert len(set(ids)) == len(ids)
    assert len(random_id()) == ID_CHARS and HEX_ID.fullmatch(random_id())


def test_consecutive_ids_share_nothing_a_guess_could_use() -> None:
    """The old ids were a per-process prefix plus a counter: one id gave away the
    next. Now no two consecutive ids agree on their first 12 digits, and the
    generators of one process do not share a prefix either."""
    a, b = IdGenerator(), IdGenerator()
    ids = [a() for _ in range(2000)]
    assert all(x[:12] != y[:12] for x, y in zip(ids, ids[1:], strict=False))
    assert a()[:12] != b()[:12]
    assert set(a.text()) <= set(string.hexdigits.lower())


def test_a_forked_child_never_repeats_the_parents_ids() -> None:
    gen = IdGenerator()
    gen()  # a block is drawn; the child inherits it
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, then out without pytest's teardown
        try:
            os.write(write_fd, b"".join(gen() for _ in range(100)))
        finally:
            os._exit(0)
    os.close(write_fd)
    raw = b""
    while chunk := os.read(read_fd, 65536):
        raw += chunk
    os.close(read_fd)
    os.waitpid(pid, 0)
    child = {raw[i : i + ID_CHARS] for i in range(0, len(raw), ID_CHARS)}
    parent = {gen() for _ in range(100)}
    assert len(child) == 100
    assert not child & parent


def test_a_fixed_prefix_gives_predictable_ids_for_tests() -> None:
    gen = IdGenerator(b"b-")
    assert [gen(), gen.text()] == [b"b-00000001", "b-00000002"]
    assert gen.prefix == b"b-"


def test_every_protocol_accepts_the_ids() -> None:
    gen = IdGenerator()
    msgid = gen()
    headers = format_headers(guarantee=False, reply_requested=True)
    request = F.decode(F.encode_request(msgid, b"default", headers, b"[]"))
    assert isinstance(request, F.Request) and request.msgid == msgid
    ack = F.decode(F.encode_ack(gen(), msgid))
    assert isinstance(ack, F.Ack) and ack.ack_msgid == msgid
    produced = pzq.decode_produce(pzq.produce(msgid, [b"body"]))
    assert produced.msg_id == msgid
    reply = mdp.decode(
        [mdp.WORKER, mdp.FINAL, b"client-address", b"", msgid, b"body"]  # draft framing
    )
    assert isinstance(reply, mdp.WorkerReply) and reply.request_id == msgid
