"""eMQP/1.0 frames: pure encode/decode, no sockets, no Django, no clock."""

from emq_django.protocol.body import RunBody, decode_run_body, encode_run_body
from emq_django.protocol.frames import (
    PEER_SCHEDULER,
    PEER_WORKER,
    PROTOCOL,
    Ack,
    Command,
    Disconnect,
    Error,
    Heartbeat,
    Inform,
    Kbye,
    Publish,
    Ready,
    Reply,
    Request,
    Schedule,
    Unschedule,
    decode,
    parse_queues,
    reply_flags,
)
from emq_django.protocol.headers import Headers, format_headers, parse_headers

__all__ = [
    "PEER_SCHEDULER", "PEER_WORKER", "PROTOCOL", "Ack", "Command", "Disconnect", "Error",
    "Headers", "Heartbeat", "Inform", "Kbye", "Publish", "Ready", "Reply", "Request",
    "RunBody", "Schedule", "Unschedule", "decode", "decode_run_body", "encode_run_body",
    "format_headers", "parse_headers", "parse_queues", "reply_flags",
]
