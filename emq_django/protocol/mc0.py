"""mc0 (the MCollective 0MQ connector's protocol) as typed frames
(specs/mc0-protocol.txt; WIRE-NOTES.md wins where they differ).

Every message, either way, starts with an empty frame, then a verb, then header
frames in key/value pairs, then optionally an empty frame and positional frames:
``['', VERB, k1, v1, ..., '', positional...]``. The first empty frame after the
verb ends the headers, so a header's value is never empty. Every frame list here
excludes the ROUTER identity.

- From the connector: ``CONNECT`` (``VERSION`` 0.2 or 0.3, ``TTL`` in ms, ``ID``),
  ``SUB`` / ``UNSUB`` (topics as positional frames), ``PUT`` (``TOPIC`` header, one
  body frame), ``NOOP``, ``DISCONNECT``. A command with an ``ID`` is answered
  ``['', 'OK', 'ID', id]`` or ``['', 'ERROR', 'ID', id, 'MESSAGE', why]``.
- From the broker: ``MESSAGE`` (every PUT header but ``ID``, then the body),
  ``OK``, ``ERROR``, ``NOOP``.

``decode`` raises ``ProtocolError`` for anything else (no leading empty frame, an
unknown verb, an odd number of header frames, a bad value), carrying the command's
``ID`` when it had one so that the ERROR can name it. Pure: no sockets, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from emq_django.exceptions import ProtocolError
from emq_django.protocol.limits import MAX_NAME_LENGTH

VERSIONS = (b"0.2", b"0.3")  # the connector sends 0.2, the document says 0.3
CONNECT, DISCONNECT, SUB, UNSUB, PUT, NOOP = (
    b"CONNECT",
    b"DISCONNECT",
    b"SUB",
    b"UNSUB",
    b"PUT",
    b"NOOP",
)
MESSAGE, OK, ERROR = b"MESSAGE", b"OK", b"ERROR"
CLIENT_VERBS = frozenset((CONNECT, DISCONNECT, SUB, UNSUB, PUT, NOOP))
ID, TOPIC, VERSION, TTL = b"ID", b"TOPIC", b"VERSION", b"TTL"
MAX_TTL_MS = 24 * 3600 * 1000  # a day: a longer TTL is a mistake, not a wish
MAX_HEADERS = 64  # key/value pairs in one command
MAX_ID = 255  # bytes; the ID comes back in the answer


class Mc0Error(ProtocolError):
    """A command refused; ``msg_id`` is its ``ID`` header (``b""`` if none)."""

    def __init__(self, reason: str, frames: Sequence[bytes] = (), msg_id: bytes = b"") -> None:
        super().__init__(reason, frames)
        self.msg_id = msg_id


@dataclass(frozen=True, slots=True)
class Command:
    """One connector command. ``headers`` keep their order (MESSAGE repeats them)."""

    verb: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    positional: tuple[bytes, ...]

    def header(self, key: bytes) -> bytes | None:
        for k, v in self.headers:
            if k == key:
                return v
        return None

    @property
    def msg_id(self) -> bytes:
        return self.header(ID) or b""


@dataclass(frozen=True, slots=True)
class Connect:
    version: bytes
    ttl: float  # seconds


def decode(frames: Sequence[bytes]) -> Command:
    """A connector's command; raises ``Mc0Error`` for anything malformed. The verb
    is checked here; each verb's own headers by ``connect_params``, ``put_topic``,
    ``topics``."""
    if not frames:
        raise Mc0Error("an empty message", frames)
    if frames[0] != b"":
        raise Mc0Error("a message must start with an empty frame", frames)
    if len(frames) < 2 or not frames[1]:
        raise Mc0Error("no verb after the empty frame", frames)
    verb = frames[1]
    try:
        end = frames.index(b"", 2)
    except ValueError:
        end = len(frames)
    raw = frames[2:end]
    pairs = tuple(zip(raw[::2], raw[1::2], strict=False))
    msg_id = next((v for k, v in pairs if k == ID), b"")
    if len(msg_id) > MAX_ID:
        raise Mc0Error(f"the ID is over {MAX_ID} bytes", frames)  # too long to echo
    if len(raw) % 2:
        raise Mc0Error(
            f"an odd number of header frames ({len(raw)}): headers are key/value pairs",
            frames,
            msg_id,
        )
    if len(pairs) > MAX_HEADERS:
        raise Mc0Error(f"more than {MAX_HEADERS} headers", frames, msg_id)
    if verb not in CLIENT_VERBS:
        shown = verb[:32].decode("utf-8", "replace")
        raise Mc0Error(f"unknown verb {shown!r}", frames, msg_id)
    return Command(verb, pairs, tuple(frames[end + 1 :]))


def connect_params(cmd: Command, frames: Sequence[bytes] = ()) -> Connect:
    """CONNECT's VERSION and TTL; raises ``Mc0Error`` for a missing or bad one."""
    version = cmd.header(VERSION)
    if version not in VERSIONS:
        raise Mc0Error(f"VERSION {version!r} is not supported (0.2 or 0.3)", frames, cmd.msg_id)
    raw = cmd.header(TTL)
    if raw is None:
        raise Mc0Error("CONNECT needs a TTL (milliseconds)", frames, cmd.msg_id)
    try:
        ttl_ms = int(raw)
    except ValueError:
        raise Mc0Error(
            f"TTL {raw[:20]!r} is not a whole number of ms", frames, cmd.msg_id
        ) from None
    if not 0 < ttl_ms <= MAX_TTL_MS:
        raise Mc0Error(f"TTL {ttl_ms} ms is out of range (1..{MAX_TTL_MS})", frames, cmd.msg_id)
    return Connect(version, ttl_ms / 1000.0)


def check_topic(raw: bytes, frames: Sequence[bytes] = (), msg_id: bytes = b"") -> str:
    """A topic as text; raises ``Mc0Error`` if empty, too long or not UTF-8."""
    if not raw:
        raise Mc0Error("an empty topic", frames, msg_id)
    if len(raw) > MAX_NAME_LENGTH:
        raise Mc0Error(f"a topic over {MAX_NAME_LENGTH} bytes", frames, msg_id)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise Mc0Error("a topic that is not UTF-8", frames, msg_id) from None


def topics(cmd: Command, frames: Sequence[bytes] = ()) -> list[str]:
    """SUB's or UNSUB's topics (the positional frames)."""
    return [check_topic(raw, frames, cmd.msg_id) for raw in cmd.positional]


def put_topic(cmd: Command, frames: Sequence[bytes] = ()) -> tuple[str, bytes]:
    """PUT's topic and body; raises ``Mc0Error`` without a TOPIC or one body."""
    raw = cmd.header(TOPIC)
    if raw is None:
        raise Mc0Error("PUT needs a TOPIC header", frames, cmd.msg_id)
    topic = check_topic(raw, frames, cmd.msg_id)
    if len(cmd.positional) != 1:
        raise Mc0Error(
            f"PUT carries one body frame after the empty frame, not {len(cmd.positional)}",
            frames,
            cmd.msg_id,
        )
    return topic, cmd.positional[0]


def forwarded_headers(cmd: Command) -> tuple[tuple[str, str], ...]:
    """The PUT headers a MESSAGE repeats beside TOPIC: every one but ID and TOPIC,
    as text (bytes that are not UTF-8 survive as surrogate escapes)."""
    return tuple(
        (k.decode("utf-8", "surrogateescape"), v.decode("utf-8", "surrogateescape"))
        for k, v in cmd.headers
        if k not in (ID, TOPIC)
    )


# ---- what goes out ------------------------------------------------------------------


def command(
    verb: bytes, headers: Sequence[tuple[bytes, bytes]] = (), *positional: bytes
) -> list[bytes]:
    """Any message: ``['', verb, k, v, ..., ('', positional...)]``."""
    out = [b"", verb]
    for k, v in headers:
        out += (k, v)
    if positional:
        out.append(b"")
        out += positional
    return out


def ok(msg_id: bytes) -> list[bytes]:
    return [b"", OK, ID, msg_id]


def error(description: str, msg_id: bytes = b"") -> list[bytes]:
    head = [b"", ERROR, ID, msg_id] if msg_id else [b"", ERROR]
    return [*head, b"MESSAGE", description.encode("utf-8", "replace")]


def noop() -> list[bytes]:
    return [b"", NOOP]


def message(topic: str, data: bytes, headers: Sequence[tuple[str, str]] = ()) -> list[bytes]:
    """A MESSAGE for a subscriber: TOPIC first, the PUT's other headers, the body.
    A header that is empty on either side cannot travel (the empty frame ends the
    headers) and is left out."""
    out = [b"", MESSAGE, TOPIC, topic.encode()]
    for k, v in headers:
        kb, vb = k.encode("utf-8", "surrogateescape"), v.encode("utf-8", "surrogateescape")
        if kb and vb and kb not in (ID, TOPIC):
            out += (kb, vb)
    out += (b"", data)
    return out
