"""The records a worker process hands to its job manager's recorder process, as
one two-frame message (``RecordBatch``), and their decoding there (``decode_batch``)."""

from __future__ import annotations

import json
from typing import Any

from emq_django.worker.recording import (
    JobRecord,
    split_attempt,
)

_encode = json.JSONEncoder(separators=(",", ":")).encode


class RecordBatch:
    """The records a worker process has not handed over yet, kept as it got them.

    A job's record costs the worker process next to nothing: its request body
    (with the args and kwargs) and its REPLY body stay the bytes that came and
    went over the wire, and the other fields are strings and numbers in a tuple
    (no container the garbage collector must walk while thousands wait), the
    times in integer microseconds (JSON writes them faster than floats). The
    recorder process decodes them (``decode_batch``), at its own pace.

    The message is two frames: a JSON header ``{"manager": ..., "rows": [...]}``,
    a row per record, and the bytes of every record's attempt id, request body
    and REPLY body one after the other, whose lengths end each row.
    """

    __slots__ = ("manager", "rows", "parts")

    def __init__(self, manager: str) -> None:
        self.manager = manager
        self.rows: list[tuple[Any, ...]] = []
        self.parts: list[bytes] = []

    def __len__(self) -> int:
        return len(self.rows)

    def add(
        self,
        attempt_id: bytes,
        task: str,
        queue: str,
        started_us: int,
        finished_us: int,
        failed: bool,
        error_type: str,
        retry_count: int,
        request: bytes,
        reply: bytes,
        lost: bool = False,
        partials: int = 0,
    ) -> None:
        self.rows.append(
            (task, queue, started_us, finished_us, failed, error_type, retry_count, lost,
             len(attempt_id), len(request), len(reply), partials)
        )  # fmt: skip
        self.parts += (attempt_id, request, reply)

    def encode(self) -> list[bytes]:
        header = _encode({"manager": self.manager, "rows": self.rows}).encode()
        return [header, b"".join(self.parts)]

    def clear(self) -> None:
        self.rows.clear()
        self.parts.clear()

    def drop_oldest(self, count: int) -> None:
        del self.rows[:count]
        del self.parts[: 3 * count]


def decode_batch(frames: list[bytes]) -> list[JobRecord]:
    """``RecordBatch.encode``'s frames -> records; raises ValueError on anything else."""
    if len(frames) != 2:
        raise ValueError(f"a batch has 2 frames, not {len(frames)}")
    header, blob = frames
    doc = json.loads(header)
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise ValueError("the header is not {manager, rows}")
    manager = doc.get("manager")
    if not isinstance(manager, str):
        raise ValueError("the header names no manager")
    records = []
    at = 0
    for row in doc["rows"]:
        if type(row) is not list or len(row) not in (11, 12):
            raise ValueError(f"not a record: {str(row)[:100]}")
        task, queue, started, finished, failed, error, retries, lost, n_id, n_req, n_rep = row[:11]
        partials = row[11] if len(row) == 12 else 0  # 11: from a worker before streaming
        if not (
            type(partials) is int
            and partials >= 0
            and type(n_id) is int
            and type(n_req) is int
            and type(n_rep) is int
            and type(started) is int
            and type(finished) is int
            and type(retries) is int
            and n_id >= 0
            and n_req >= 0
            and n_rep >= 0
        ):
            raise ValueError(f"bad numbers in {str(row)[:100]}")
        attempt_id = blob[at : at + n_id]
        at += n_id
        request = blob[at : at + n_req]
        at += n_req
        reply = blob[at : at + n_rep]
        at += n_rep
        job_id, attempt = split_attempt(attempt_id)
        args, kwargs = _arguments(request)
        records.append(
            JobRecord(
                job_id, attempt, str(task), str(queue), args, kwargs, started / 1e6,
                finished / 1e6, failed is True, str(error), reply, manager, lost is True,
                retries, partials,
            )
        )  # fmt: skip
    if at != len(blob):
        raise ValueError(f"the bodies are {len(blob)} bytes, the rows account for {at}")
    return records


def _arguments(request: bytes) -> tuple[list[Any], dict[str, Any]]:
    """The args and kwargs of a request body (``["run", {...}]``); none when it
    is not one (the job was refused as malformed, or the job manager does not
    know it)."""
    if not request:
        return [], {}
    try:
        data = json.loads(request.decode())  # str: json need not guess the encoding
    except RecursionError:  # nested too deep: the worker refused it (protocol/limits.py)
        return [], {}
    except ValueError:  # UnicodeDecodeError too: not UTF-8 (it may be UTF-16 JSON)
        try:
            data = json.loads(request)
        except (ValueError, RecursionError):
            return [], {}
    spec = data[1] if isinstance(data, list) and len(data) == 2 else None
    if not isinstance(spec, dict):
        return [], {}
    args, kwargs = spec.get("args") or [], spec.get("kwargs") or {}
    return (args if isinstance(args, list) else []), (kwargs if isinstance(kwargs, dict) else {})
