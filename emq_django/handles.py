"""Result handles returned by ``delay()``, ``apply_async()`` and ``emq.result()``.

A REPLY is routed to the client socket that sent the job, so it cannot reach a
process that restarted since. When the ``emq_django.results`` app is installed,
``get()`` also looks for the job in the history (``JobResult``, written by the
job managers' recorder) while it waits, and ``result(id)`` gives a handle that
reads only from there.
"""

from __future__ import annotations

import json
import json.scanner
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Any

from emq_django.exceptions import (
    PartialsLost,
    ResultTimeout,
    ResultUnavailable,
    TaskFailed,
    type_name,
)

if TYPE_CHECKING:
    from emq_django.client import Client

# ``get()`` waits this long for the REPLY before it first asks the database, then
# asks again at this interval: jobs that finish quickly never cost a query.
HISTORY_FIRST_LOOK = 1.0
HISTORY_POLL = 0.25


_client_module: Any = None  # emq_django.client, once loaded (lazily: it opens sockets)


def client_module() -> Any:
    """``emq_django.client``, imported on first use (it opens sockets), then kept."""
    global _client_module
    module = _client_module
    if module is None:
        from emq_django import client as module

        _client_module = module
    return module


def _process_client() -> Client:
    """This process's client (``client.get_client()``, without an import per call)."""
    return (_client_module or client_module()).get_client()


_installed: tuple[object, bool] = (None, False)  # (apps.app_configs, the answer)
_apps: Any = None  # django.apps.apps, once imported


def history_installed() -> bool:
    global _installed, _apps
    apps = _apps
    if apps is None:
        from django.apps import apps

        _apps = apps
    configs = apps.app_configs  # a new dict when INSTALLED_APPS changes (tests)
    seen, answer = _installed
    if seen is configs:
        return bool(answer)
    answer = apps.ready and apps.is_installed("emq_django.results")
    if apps.ready:  # once ready, that dict is never changed in place
        _installed = (configs, answer)
    return bool(answer)


# (found, value, error, task) of a finished job from the job history: registered by
# the results app's ready() (results/apps.py), so that this module does not import it.
_stored_outcome: Callable[[str], tuple[bool, Any, TaskFailed | None, str]] | None = None


def set_history_lookup(
    lookup: Callable[[str], tuple[bool, Any, TaskFailed | None, str]],
) -> None:
    global _stored_outcome
    _stored_outcome = lookup


def _from_history(job_id: str) -> tuple[bool, Any, TaskFailed | None, str]:
    from django.db import DatabaseError

    if _stored_outcome is None:  # the results app is installed but not ready yet
        return False, None, None, ""
    try:
        return _stored_outcome(job_id)
    except (DatabaseError, RuntimeError):  # RuntimeError: DB access blocked (pytest-django)
        return False, None, None, ""


class Result:
    """A job's handle: ``.id`` and ``.get(timeout=)``."""

    # Until set on the instance (one handle per job sent: fewer stores per delay())
    _done = False
    _value: Any = None
    _error: TaskFailed | None = None
    attempt = 0  # the attempt the last streamed partial result came from
    # a plain job's: its client's ``broker_changes`` when it was sent (JobLost); None:
    # a guaranteed job (the broker's journal keeps it), or one not stamped
    _sent_at_change: int | None = None
    _seq = 0  # ... and its number within that attempt
    # a unique job's: the broker already had a job with its key, and this is that one
    duplicate = False

    def __init__(
        self, job_id: str, task_name: str, *, reply: bool = True, client: Client | None = None
    ) -> None:
        self.id = job_id
        self.task_name = task_name
        self.reply = reply
        self._client = client

    def __repr__(self) -> str:
        return f"<Result {self.id} of {self.task_name}>"

    def stream(self, timeout: float | None = 30.0) -> Iterator[Any]:
        """Yield the task's partial results as they arrive (each value a generator
        task yields, or passes to ``emq.partial()``), in order, then its final
        value. ``timeout``: the longest wait for each next one (``ResultTimeout``).
        Raises what ``get()`` raises (``TaskFailed`` after the partials sent before
        the failure), and ``PartialsLost`` when some went missing.

        A retried job's stream goes on with the new attempt's partials, from its
        first (``self.attempt`` says which attempt the last value came from). Once
        the result is in (``get()`` returned, or a stream ended), a stream yields
        the final value only."""
        if not self._done:
            if not self.reply:
                raise ResultUnavailable(
                    f"job {self.id} ({self.task_name}) was sent with "
                    "reply=False, so nothing comes back"
                )
            yield from self._stream_partials(timeout)
        yield self.get()

    def _stream_partials(self, timeout: float | None) -> Iterator[Any]:
        client = self._client or _process_client()
        msgid = self._msgid_bytes()
        while True:
            item = client.next_streamed(msgid, timeout)
            if not isinstance(item, tuple):  # the REPLY: the outcome
                self._settle(item.body)
                return
            attempt, seq, body = item
            if attempt < self.attempt:
                continue  # a late partial of an attempt that was retried
            if attempt > self.attempt:  # a new attempt (a retry): its stream restarts
                self.attempt, self._seq = attempt, 0
            if seq != self._seq + 1:
                missing = seq - self._seq - 1
                self._seq = seq
                raise PartialsLost(
                    f"{missing} partial results of job {self.id} (attempt {attempt}) "
                    "went missing before this one"
                )
            self._seq = seq
            yield decode_reply_body(body)[0]

    async def astream(self, timeout: float | None = 30.0) -> AsyncIterator[Any]:
        """``stream()`` for ``async for``: each wait runs in a thread
        (``asyncio.to_thread``), so the event loop goes on meanwhile."""
        import asyncio

        parts = self.stream(timeout)
        end = object()
        while True:
            value = await asyncio.to_thread(next, parts, end)
            if value is end:
                return
            yield value

    def get(self, timeout: float | None = 30.0) -> Any:
        """The task's return value. Raises ``TaskFailed`` if it raised,
        ``ResultTimeout`` if no result came within ``timeout`` seconds,
        ``ResultUnavailable`` if it was sent without ``reply``,
        ``JobRefused`` if the broker refused it, and ``BrokerUnavailable`` if the
        broker did not acknowledge a send within ``EMQ_ACK_TIMEOUT``."""
        if not self._done:
            if not self.reply:
                raise ResultUnavailable(
                    f"job {self.id} ({self.task_name}) was sent with "
                    "reply=False, so no result comes back"
                )
            self._wait(timeout)
        if self._error is not None:
            raise self._error
        return self._value

    def _wait(self, timeout: float | None) -> None:
        client = self._client or _process_client()
        msgid = self._msgid_bytes()
        # wait_reply takes a REPLY that came already without a poll (the drain that
        # read it, for whichever handle, kept it)
        # (a client without the attribute, a stand-in for Client, may be recorded)
        if not history_installed() or not getattr(client, "records_history", True):
            self._settle(client.wait_reply(msgid, timeout, self._sent_at_change).body)
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        step = HISTORY_FIRST_LOOK
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            wait = step if remaining is None else max(min(step, remaining), 0.0)
            try:
                self._settle(client.wait_reply(msgid, wait, self._sent_at_change).body)
                return
            except ResultTimeout:
                pass
            if self._settle_from_history():
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise ResultTimeout(f"no result for job {self.id} within {timeout} s")
            step = HISTORY_POLL

    def _settle_from_history(self) -> bool:
        found, value, error, _ = _from_history(self.id)
        if found:
            self._value, self._error, self._done = value, error, True
        return found

    def ready(self) -> bool:
        """True once the result has arrived (never blocks)."""
        if not self._done and self.reply:
            client = self._client or _process_client()
            reply = client.poll_reply(self._msgid_bytes())
            if reply is not None:
                self._settle(reply.body)
        return self._done

    def _settle(self, body: bytes) -> None:
        self._value, self._error = decode_reply_body(body)
        self._done = True

    def _msgid_bytes(self) -> bytes:
        return self.id.encode()


class _IdOfMsgid:
    """``SentResult.id``: the msgid's text, decoded when first read (most handles of
    pipelined jobs are never read). Not a data descriptor: the instance keeps it."""

    def __get__(self, handle: SentResult | None, owner: type | None = None) -> Any:
        if handle is None:
            return self
        job_id = handle.__dict__["id"] = handle._msgid.decode()
        return job_id


class SentResult(Result):
    """The handle ``Task.delay()`` returns, made at the least cost per job: each
    task has its own subclass (``for_task``), whose class attributes are the task's
    name and ``reply``, and ``delay()`` sets ``_msgid`` on a bare instance of it
    (no ``__init__`` call). ``get()`` waits on this process's client."""

    id = _IdOfMsgid()
    _msgid: bytes

    def __init__(self, msgid: bytes) -> None:  # delay() does this without the call
        self._msgid = msgid

    def _msgid_bytes(self) -> bytes:
        return self._msgid

    @classmethod
    def for_task(cls, task_name: str, reply: bool, plain: bool = False) -> type[SentResult]:
        """``plain``: the task's jobs are not guaranteed: their handles count as sent
        before the client's first broker change (``_sent_at_change`` 0; ``delay()``
        sets it on the instance only after a change)."""
        attributes = {"task_name": task_name, "reply": reply, "_client": None}
        if plain:
            attributes["_sent_at_change"] = 0
        return type("Result", (cls,), attributes)


class StoredResult(Result):
    """``emq.result(id)``: a job's result read from the history, from any process.

    Works after the sending process restarted; needs ``emq_django.results`` in
    ``INSTALLED_APPS`` and a recorder (``EMQ_RECORDER``) on the job managers.
    """

    def __init__(self, job_id: str, task_name: str = "") -> None:
        super().__init__(job_id, task_name)

    def __repr__(self) -> str:
        return f"<StoredResult {self.id}>"

    def _wait(self, timeout: float | None) -> None:
        local = _unrecorded_client()
        if local is not None:  # the in-memory broker's (emq_django.testing): no history
            self._settle(local.wait_reply(self.id.encode(), timeout).body)
            return
        if not history_installed():
            raise ResultUnavailable(
                f"emq.result({self.id!r}) reads the job history: add "
                '"emq_django.results" to INSTALLED_APPS and set EMQ_RECORDER'
            )
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._settle_from_history():
            if deadline is not None and time.monotonic() >= deadline:
                raise ResultTimeout(f"job {self.id} is not in the history after {timeout} s")
            time.sleep(HISTORY_POLL)

    def _settle_from_history(self) -> bool:
        found, value, error, task = _from_history(self.id)
        if found:
            self._value, self._error, self._done = value, error, True
            self.task_name = self.task_name or task
        return found

    def ready(self) -> bool:
        if self._done:
            return True
        local = _unrecorded_client()
        if local is not None:
            reply = local.poll_reply(self.id.encode())
            if reply is not None:
                self._settle(reply.body)
            return self._done
        return history_installed() and self._settle_from_history()


def _unrecorded_client() -> Client | None:
    """This process's client when no job manager records its jobs in the history
    (``records_history``: the in-memory broker's, which keeps their results)."""
    client = client_module().current_client()
    if client is None or getattr(client, "records_history", True):
        return None
    return client


def result(job_id: str) -> Result:
    """The handle of job ``job_id`` (``Result.id``), usable from any process:
    ``emq.result(job_id).get(timeout=10)``. Reads the job history."""
    return StoredResult(job_id)


_scan = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]


def _loads(body: bytes) -> Any:
    """``json.loads(body)``, without its encoding detection and whitespace
    regexes for the UTF-8 JSON our workers write; anything else goes through it."""
    try:
        text = body.decode()
        value, end = _scan(text, 0)
        if end == len(text):
            return value
    except (UnicodeDecodeError, StopIteration, ValueError, RecursionError):
        pass
    return json.loads(body)


def decode_reply_body(body: bytes) -> tuple[Any, TaskFailed | None]:
    """(value, None) or (None, TaskFailed) from a REPLY body."""
    try:
        data = _loads(body)
    except ValueError:
        return None, TaskFailed("ProtocolError", f"reply body is not JSON: {body[:100]!r}")
    if isinstance(data, dict) and "error" in data and isinstance(data["error"], dict):
        err = data["error"]
        return None, TaskFailed.from_remote(
            str(err.get("type", "Exception")),
            str(err.get("message", "")),
            str(err.get("traceback", "")),
        )
    if isinstance(data, dict) and "value" in data:
        return data["value"], None
    return data, None  # a peer that replies with a bare value


class EagerResult(Result):
    """The result of a task run in-process under ``EMQ_EAGER``."""

    def __init__(
        self,
        task_name: str,
        *,
        value: Any = None,
        error: BaseException | None = None,
        partials: list[bytes] | None = None,
    ) -> None:
        import uuid

        super().__init__(uuid.uuid4().hex, task_name)
        self._done = True
        self._value = value
        self._partials = partials or []  # bodies, as the worker would have sent them
        if error is not None:
            import traceback

            tb = "".join(traceback.format_exception(error))
            self._error = TaskFailed(type_name(error), str(error), tb)

    def stream(self, timeout: float | None = 30.0) -> Iterator[Any]:
        """The partial results the task produced, then its final value (or what
        ``get()`` raises). Each can be streamed once."""
        partials, self._partials = self._partials, []
        for body in partials:
            yield decode_reply_body(body)[0]
        yield self.get()


def run_eagerly(fn: Callable[..., Any], task_name: str, body: bytes) -> EagerResult:
    """``EMQ_EAGER``: run ``fn`` here and now, through the same JSON round trip."""
    from emq_django.streaming import partial_sink, run_task

    spec = json.loads(body)[1]
    partials: list[bytes] = []
    token = partial_sink.set(partials.append)
    try:
        value = run_task(fn, spec["args"], spec["kwargs"])
        json.dumps(value)
    except Exception as exc:  # the result carries it, as a remote failure would
        return EagerResult(task_name, error=exc, partials=partials)
    finally:
        partial_sink.reset(token)
    return EagerResult(task_name, value=value, partials=partials)
