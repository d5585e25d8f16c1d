"""What ``Task`` and the result handles ask of this process's client: the small
transport interface (send, wait, stream, cancel) that the eMQP client
(``Client``) and the in-memory broker's client (``emq_django.testing``) both
implement. A structural type: neither inherits from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from emq_django.protocol import frames as F


class Transport(Protocol):
    """A client: sends jobs, waits for and streams their outcome, cancels them."""

    records_history: bool  # job managers record its jobs' results (emq_django.results)
    broker_changes: int  # times the broker was replaced (a plain job sent before: JobLost)

    # ---- send ---------------------------------------------------------------
    def new_id(self) -> str: ...
    def send(
        self,
        queue: str,
        headers: bytes,
        body: bytes,
        *,
        confirm: bool = False,
        job_id: str | None = None,
        noreply: bool = False,
    ) -> str: ...
    def send_request(
        self,
        queue: bytes,
        headers: bytes,
        body: bytes,
        *,
        confirm: bool = False,
        msgid: bytes | None = None,
        noreply: bool = False,
    ) -> bytes: ...
    def send_pipelined(
        self,
        queue: bytes,
        headers: bytes,
        body: bytes,
        head: bytes | None,
        tail: bytes | None,
        noreply: bool = False,
    ) -> bytes: ...
    def send_batch(
        self,
        queue: str,
        headers: bytes,
        bodies: Sequence[bytes],
        job_ids: Sequence[str],
        *,
        confirm: bool = False,
        results: Sequence[Any] = (),
        noreply: bool = False,
    ) -> None: ...
    def send_frames(self, frames: list[bytes], msgid: bytes, *, confirm: bool = True) -> None: ...
    def flush(self, timeout: float | None = None) -> None: ...

    # ---- wait ---------------------------------------------------------------
    def take_reply(self, msgid: bytes) -> F.Reply | None: ...
    def wait_reply(
        self, msgid: bytes, timeout: float | None, sent_at_change: int | None = None
    ) -> F.Reply: ...

    # ---- stream -------------------------------------------------------------
    def next_streamed(
        self, msgid: bytes, timeout: float | None
    ) -> tuple[int, int, bytes] | F.Reply: ...
    def next_streamed_of(
        self, msgids: Mapping[bytes, int], timeout: float | None, then: bytes | None = None
    ) -> tuple[bytes, tuple[int, int, bytes] | F.Reply]: ...

    # ---- cancel -------------------------------------------------------------
    def cancel(self, job_id: str) -> bool: ...
    def close(self) -> None: ...
