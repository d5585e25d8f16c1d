"""The in-memory broker's client: what ``Task`` and the result handles call on
this process's client (``emq_django.client.Client``), without a socket.

A send goes to the core at once, so the ACK or the refusal is known at once: a
refused job raises what the real client raises, and where it raises it
(``QueueFull``/``JobRefused`` from ``send()`` with ``confirm`` and from the
job's ``get()``, ``JobsRefused`` from the next send for jobs sent without
reply). A wait never sleeps: it runs what is ready, and when the result still
is not in, raises ``ResultTimeout`` saying what the job waits for.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping, Sequence
from itertools import chain
from typing import TYPE_CHECKING, Any, Protocol

from emq_django.client import refusal as _refusal  # the error the real client raises
from emq_django.exceptions import JobsRefused, ProtocolError, ResultTimeout
from emq_django.ids import IdGenerator
from emq_django.protocol import frames as F
from emq_django.protocol.limits import check_job_id

if TYPE_CHECKING:
    from emq_django.broker.effects import Answer, ClientRef, Refuse
    from emq_django.protocol.headers import Headers

log = logging.getLogger(__name__)


class Broker(Protocol):
    """What the client asks of the in-memory broker (``InMemoryBroker``)."""

    def request(
        self, client: ClientRef, msgid: bytes, queue: str, headers: Headers, body: bytes
    ) -> None: ...
    def refuse(self, client: ClientRef, msgid: bytes, code: str, reason: str) -> None: ...
    def cancel(self, job_id: bytes) -> str: ...
    def run(self) -> int: ...
    def why_waiting(self, job_id: bytes) -> str: ...


class MemoryClient:
    """This process's client while an ``InMemoryBroker`` is installed."""

    records_history = False  # no job manager records its jobs: get() asks only here
    broker_changes = 0  # the in-memory broker never restarts: no JobLost

    def __init__(self, broker: Broker, ref: ClientRef) -> None:
        self.broker = broker
        self.ref = ref
        self._ids = IdGenerator()
        self._replies: dict[bytes, F.Reply] = {}
        self._errors: dict[bytes, F.Error] = {}
        self._partials: dict[bytes, deque[tuple[int, int, bytes]]] = {}
        self._noreply: set[bytes] = set()
        self._refused: list[tuple[str, str, str]] = []

    # ---- sending ------------------------------------------------------------

    def new_id(self) -> str:
        return self._ids().decode()

    def send(
        self,
        queue: str,
        headers: bytes,
        body: bytes,
        *,
        confirm: bool = False,
        job_id: str | None = None,
        noreply: bool = False,
    ) -> str:
        """As ``Client.send``: returns the job's id."""
        given = check_job_id(job_id) if job_id is not None else None
        msgid = self.send_request(
            queue.encode(), headers, body, confirm=confirm, msgid=given, noreply=noreply
        )
        return msgid.decode()

    def send_request(
        self,
        queue: bytes,
        headers: bytes,
        body: bytes,
        *,
        confirm: bool = False,
        msgid: bytes | None = None,
        noreply: bool = False,
    ) -> bytes:
        """As ``Client.send_request``: the job goes to the core now."""
        if self._refused:
            self._raise_refused(not_sent=True)
        msgid = msgid or self._ids()
        if noreply and not confirm:
            self._noreply.add(msgid)
        frames = [b"", F.PROTOCOL, F.REQUEST, msgid, queue, headers, body]
        try:
            name, parsed = F.job_fields(queue, headers, frames)
        except ProtocolError as exc:  # as the real broker answers a malformed REQUEST
            self.broker.refuse(self.ref, msgid, exc.code, exc.reason)
        else:
            self.broker.request(self.ref, msgid, name, parsed, body)
        if confirm and msgid in self._errors:
            raise _refusal(self._errors.pop(msgid))
        return msgid

    def send_pipelined(
        self,
        queue: bytes,
        headers: bytes,
        body: bytes,
        head: bytes | None,
        tail: bytes | None,
        noreply: bool = False,
    ) -> bytes:
        """As ``Client.send_pipelined`` (``delay()``'s path)."""
        return self.send_request(queue, headers, body, noreply=noreply)

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
    ) -> None:
        """As ``Client.send_batch`` (``Task.map()``)."""
        if len(job_ids) != len(bodies):
            raise ValueError("one job id per body")
        for body, job_id in zip(bodies, job_ids, strict=True):
            msgid = job_id.encode()
            self.send_request(
                queue.encode(), headers, body, confirm=False, msgid=msgid, noreply=noreply
            )
        if confirm:
            refused = [i.encode() for i in job_ids if i.encode() in self._errors]
            if refused:
                raise _refusal(self._errors.pop(refused[0]))

    def send_frames(self, frames: list[bytes], msgid: bytes, *, confirm: bool = True) -> None:
        raise NotImplementedError(
            "the in-memory broker takes jobs only (delay, apply_async, map): "
            "publishing and schedules need a broker process (manage.py emq_broker)"
        )

    def flush(self, timeout: float | None = None) -> None:
        """Raises ``JobsRefused`` for jobs sent without reply that were refused."""
        if self._refused:
            self._raise_refused()

    def cancel(self, job_id: str) -> bool:
        """As ``Client.cancel``: True if the job was cancelled (its ``get()`` raises
        ``Cancelled``); a job dispatched to its worker and not yet run is too."""
        if not job_id or not job_id.isprintable() or " " in job_id:
            raise ValueError(f"not a job id: {job_id!r}")
        return self.broker.cancel(job_id.encode()) in ("cancelled", "running")

    def close(self) -> None:
        """Nothing to close: no socket."""

    def _raise_refused(self, not_sent: bool = False) -> None:
        refused, self._refused = self._refused, []
        raise JobsRefused(refused, len(refused), not_sent)

    # ---- answers from the core ------------------------------------------------

    def answer(self, effect: Answer) -> None:
        job_id = effect.job.id
        if not effect.final:
            partials = self._partials.setdefault(job_id, deque())
            partials.append((effect.job.attempt, effect.seq, effect.body))
            return
        outcome = effect.outcome
        status = F.status_frame(outcome.failed, outcome.error, outcome.lost, outcome.retry)
        self._replies[job_id] = F.Reply(b"", effect.body, job_id, status)

    def refused(self, effect: Refuse) -> None:
        log.warning("the in-memory broker refused job %s: %s", effect.msgid, effect.reason)
        if effect.msgid in self._noreply:  # nobody will call its get()
            self._refused.append((effect.msgid.decode(), effect.code, effect.reason))
        else:
            self._errors[effect.msgid] = F.Error(b"", effect.msgid, effect.reason, effect.code)

    # ---- replies ------------------------------------------------------------

    def take_reply(self, msgid: bytes) -> F.Reply | None:
        """The job's REPLY if it has come, after running what is ready; raises
        ``JobRefused``/``QueueFull`` for a refused job."""
        self.broker.run()
        if msgid in self._errors:
            raise _refusal(self._errors[msgid])
        reply = self._replies.get(msgid)  # kept: emq.result(id) may read it again
        if reply is not None:
            self._partials.pop(msgid, None)  # get() took the outcome: nobody streams now
        return reply

    poll_reply = take_reply

    def wait_reply(
        self, msgid: bytes, timeout: float | None, sent_at_change: int | None = None
    ) -> F.Reply:
        """The job's REPLY; ``ResultTimeout`` at once when it is not in once what is
        ready has run (nothing else can happen until the test moves the clock)."""
        reply = self.take_reply(msgid)
        if reply is None:
            raise ResultTimeout(self.broker.why_waiting(msgid))
        return reply

    def next_streamed(
        self, msgid: bytes, timeout: float | None
    ) -> tuple[int, int, bytes] | F.Reply:
        """The job's next partial result as (attempt, seq, body), or after the last
        its REPLY; raises as ``wait_reply`` does."""
        self.broker.run()
        partials = self._partials.get(msgid)
        if partials:
            return partials.popleft()
        return self.wait_reply(msgid, timeout)

    def next_streamed_of(
        self, msgids: Mapping[bytes, int], timeout: float | None, then: bytes | None = None
    ) -> tuple[bytes, tuple[int, int, bytes] | F.Reply]:
        """``next_streamed`` for the lowest-ranked of ``msgids`` that has something
        (``then``'s only when none has); ``ResultTimeout`` when none has once what is ready
        has run."""
        self.broker.run()
        arrived = chain((m for m, p in self._partials.items() if p), self._errors, self._replies)
        msgid = min((m for m in arrived if m in msgids), key=msgids.__getitem__, default=then)
        if msgid is not None:
            partials = self._partials.get(msgid)
            if partials:
                return msgid, partials.popleft()
            if msgid in self._errors or msgid in self._replies:
                return msgid, self.wait_reply(msgid, timeout)
        raise ResultTimeout(self.broker.why_waiting(then or next(iter(msgids))))
