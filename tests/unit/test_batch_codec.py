"""REQUESTS (several jobs in one message), REPLIES (several answers) and the packed
ACK: protocol/batch.py."""

from __future__ import annotations

import random

import pytest

from emq_django.exceptions import ProtocolError
from emq_django.protocol import batch as B
from emq_django.protocol.frames import PROTOCOL, REQUEST

JOBS = [
    (b"job-1", b"default", b"acks", b'["run",{"args":[1]}]'),
    (b"job-2", b"email", b"reply-requested,acks", b""),
    (b"j" * 255, b"q" * 255, b"h" * 1000, b"b" * 70_000),
]


def test_requests_round_trip_keeps_every_field_and_the_order() -> None:
    frames = B.encode_requests(b"batch-1", JOBS)
    assert frames[:4] == [b"", PROTOCOL, B.REQUESTS, b"batch-1"]
    assert B.decode_jobs(frames) == JOBS


def valid() -> list[bytes]:
    return B.encode_requests(b"batch-1", JOBS[:2])


def with_data(data: bytes) -> list[bytes]:
    return [*valid()[:4], data]


GOOD = valid()[4]
HEAD = B.HEAD.size

MALFORMED = [
    pytest.param(with_data(b""), id="no-job"),
    pytest.param(with_data(GOOD[:3]), id="cut-in-a-head"),
    pytest.param(with_data(GOOD[:-1]), id="cut-in-a-body"),
    pytest.param(with_data(GOOD + b"x"), id="a-byte-left-over"),
    pytest.param(with_data(b"\x00" + GOOD[1:]), id="empty-msgid"),
    pytest.param(with_data(GOOD[:1] + b"\x00" + GOOD[2:]), id="empty-queue"),
    pytest.param(with_data(GOOD[:4] + b"\xff\xff\xff\xff" + GOOD[8:]), id="body-overruns"),
    pytest.param(valid()[:4], id="four-frames"),
    pytest.param([*valid(), b""], id="six-frames"),
    pytest.param([b"x", *valid()[1:]], id="first-frame-not-empty"),
    pytest.param([b"", b"eMQP/0.9", *valid()[2:]], id="other-protocol"),
    pytest.param([*valid()[:3], b"", GOOD], id="no-batch-msgid"),
]


@pytest.mark.parametrize("frames", MALFORMED)
def test_a_malformed_requests_message_yields_no_job(frames: list[bytes]) -> None:
    with pytest.raises(ProtocolError) as info:
        B.decode_jobs(frames)
    assert info.value.frames == frames  # the raw frames travel with the error


def test_more_jobs_than_the_limit_is_malformed() -> None:
    jobs = [(b"m%d" % i, b"q", b"", b"") for i in range(B.MAX_JOBS + 1)]
    with pytest.raises(ProtocolError, match="over"):
        B.decode_jobs(B.encode_requests(b"batch", jobs))
    assert len(B.decode_jobs(B.encode_requests(b"batch", jobs[:-1]))) == B.MAX_JOBS


def test_random_bytes_either_decode_to_whole_records_or_raise() -> None:
    rng = random.Random(18)
    for _ in range(2000):
        data = bytearray(GOOD)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        if rng.random() < 0.3:
            data = data[: rng.randrange(len(data))]
        try:
            jobs = B.decode_jobs(with_data(bytes(data)))
        except ProtocolError:
            continue
        # what decodes accounts for every byte, record by record
        size = sum(HEAD + sum(len(f) for f in job) for job in jobs)
        assert size == len(data) and all(job[0] and job[1] for job in jobs)


def test_a_field_over_its_length_is_refused_when_encoding() -> None:
    with pytest.raises(ValueError):
        B.job_record(b"", b"q", b"", b"")
    with pytest.raises(ValueError):
        B.job_record(b"m", b"q" * 256, b"", b"")
    with pytest.raises(ValueError):
        B.job_record(b"m", b"q", b"h" * (B.MAX_HEADERS_LENGTH + 1), b"")


def test_packed_ack_names_every_msgid_in_one_frame_unless_one_holds_a_newline() -> None:
    frames = B.encode_packed_ack(b"a-1", [b"m1", b"m2", b"m3"])
    assert frames is not None and frames[2] == b"ACK"
    assert frames[4].split(B.PACK_SEPARATOR) == [b"m1", b"m2", b"m3"]
    assert B.encode_packed_ack(b"a-2", [b"m1", b"bad\nid"]) is None


def test_an_ack_id_names_the_broker_incarnation_and_others_name_none() -> None:
    from emq_django.protocol.batch import MARK, ack_id, ack_incarnation

    incarnation = b"0123456789abcdef0123456789abcdef"
    ack = ack_id(incarnation, b"f" * 32)
    assert ack.startswith(MARK) and ack_incarnation(ack) == incarnation
    assert ack_incarnation(MARK + b"f" * 32) is None  # a broker from before
    assert ack_incarnation(b"x" * len(ack)) is None


def test_a_packed_delivery_unpacks_to_the_requests_it_stands_for() -> None:
    """Our broker to a worker that announced ``"packed"``: the same records, each
    read back as the 7-frame REQUEST it stands for; a malformed one is refused whole."""
    frames = B.encode_requests(b"m", [(b"a#1", b"q", b"h", b"body"), (b"b#2", b"q2", b"", b"")])
    assert B.unpack_requests(frames) == [
        [b"", PROTOCOL, REQUEST, b"a#1", b"q", b"h", b"body"],
        [b"", PROTOCOL, REQUEST, b"b#2", b"q2", b"", b""],
    ]
    with pytest.raises(ProtocolError, match="overruns"):
        B.unpack_requests([*frames[:4], frames[4][:-1]])


# ---- REPLIES: a worker process's answers packed ----------------------------------------

ANSWERS = [  # (body, ref, status), as the worker process holds them
    (b'{"value": 3}', b"job-1#1", b"ok,ready"),
    (b"", b"job-2#1", b""),
    (b"b" * 70_000, b"r" * 255, b"s" * 255),
]


def replies_with(data: bytes) -> list[bytes]:
    return [*B.encode_replies(b"m-1", ANSWERS[:2])[:4], data]


GOOD_REPLIES = B.encode_replies(b"m-1", ANSWERS[:2])[4]


def test_replies_round_trip_keeps_every_answer_and_the_order() -> None:
    frames = B.encode_replies(b"m-1", ANSWERS)
    assert frames[:4] == [b"", PROTOCOL, B.REPLIES, b"m-1"] and len(frames) == 5
    assert B.decode_replies(frames) == [(ref, status, body) for body, ref, status in ANSWERS]


@pytest.mark.parametrize(
    "frames",
    [
        pytest.param(replies_with(b""), id="no-answer"),
        pytest.param(replies_with(GOOD_REPLIES[:3]), id="cut-in-a-head"),
        pytest.param(replies_with(GOOD_REPLIES[:-1]), id="cut-in-a-body"),
        pytest.param(replies_with(GOOD_REPLIES + b"x"), id="a-byte-left-over"),
        pytest.param(replies_with(b"\x00" + GOOD_REPLIES[1:]), id="empty-ref"),
        pytest.param(
            replies_with(GOOD_REPLIES[:2] + b"\xff\xff\xff\xff" + GOOD_REPLIES[6:]),
            id="body-overruns",
        ),
        pytest.param(B.encode_replies(b"m-1", ANSWERS[:1])[:4], id="four-frames"),
        pytest.param([b"", PROTOCOL, B.REPLIES, b"", GOOD_REPLIES], id="no-msgid"),
        pytest.param([b"", b"eMQP/0.9", B.REPLIES, b"m", GOOD_REPLIES], id="other-protocol"),
    ],
)
def test_a_malformed_replies_message_yields_no_answer(frames: list[bytes]) -> None:
    with pytest.raises(ProtocolError) as info:
        B.decode_replies(frames)
    assert info.value.frames == frames


def test_more_answers_than_the_limit_is_malformed() -> None:
    answers = [(b"", b"r%d" % i, b"ok") for i in range(B.MAX_JOBS + 1)]
    with pytest.raises(ProtocolError, match="over"):
        B.decode_replies(B.encode_replies(b"m", answers))
    assert len(B.decode_replies(B.encode_replies(b"m", answers[:-1]))) == B.MAX_JOBS


def test_answers_go_packed_only_to_a_broker_that_reads_them_and_when_they_fit() -> None:
    """``answers_frames``: a REPLIES when the broker said it reads them, else (or for
    a ref or status a record cannot hold) the REPLY of three frames per answer."""
    packed = B.answers_frames(b"m", ANSWERS[:2], packed=True)
    assert packed[2] == B.REPLIES and len(packed) == 5
    joined = B.answers_frames(b"m", ANSWERS[:2], packed=False)
    assert joined[2] == b"REPLY" and len(joined) == 4 + 3 * 2
    too_long = [*ANSWERS[:1], (b"", b"r" * 256, b"ok")]
    assert B.answers_frames(b"m", too_long, packed=True)[2] == b"REPLY"
    with pytest.raises(ValueError):
        B.encode_replies(b"m", [(b"", b"", b"ok")])
