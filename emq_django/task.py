"""``@emq.task``: a registered function that can be sent to job managers."""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from emq_django import conf as _conf
from emq_django import otel, registry, signals
from emq_django.flow_control import FlowOptions, KeyOption, with_concurrency_key
from emq_django.handles import Result, SentResult, client_module, run_eagerly
from emq_django.ids import ID_CHARS
from emq_django.protocol.batch import MAX_HEADERS_LENGTH, record_head
from emq_django.protocol.body import RunBodyEncoder, encode_run_body
from emq_django.protocol.frames import with_acks_flag
from emq_django.protocol.headers import format_headers
from emq_django.protocol.limits import (
    MAX_TIMEOUT,
    check_count,
    check_priority,
    check_queue_name,
    check_seconds,
)
from emq_django.task_options import (
    check_options,
    check_size,
    check_soft_timeout,
    when_to_run,
)
from emq_django.unique_jobs import apply_call, check_unique, send_unique, unique_of, with_key

SOFT_TIMEOUT_HEADER = "soft-timeout"  # a headers extension: the soft time limit, seconds

if TYPE_CHECKING:
    from emq_django.client import Client
    from emq_django.conf import EmqSettings
    from emq_django.workflows import Signature

P = ParamSpec("P")
R = TypeVar("R")


class Task(Generic[P, R]):
    """A function registered with ``@emq.task``. Calling it runs it here."""

    def __init__(
        self,
        fn: Callable[P, R],
        *,
        queue: str,
        retries: int,
        timeout: float,
        guarantee: bool,
        reply: bool,
        on_commit: bool = False,
        soft_timeout: float = 0,
        priority: int = 0,
        unique: bool = False,
        unique_for: float = 0,
        rate_limit: str | None = None,
        max_concurrency: int | None = None,
        concurrency_key: KeyOption = None,
    ) -> None:
        if fn.__module__ == "__main__":
            raise ValueError(
                f"@emq.task on {fn.__qualname__} in __main__: define tasks in an "
                "importable module so that job managers can find them"
            )
        check_count("retries", retries)
        check_seconds("timeout", timeout, MAX_TIMEOUT)
        check_soft_timeout(soft_timeout, timeout)
        check_queue_name(queue)
        check_priority(priority)
        self.fn = fn
        self.path = fn.__module__
        self.callable = fn.__qualname__
        self.name = f"{self.path}.{self.callable}"
        self.queue = queue
        self.retries = retries
        self.timeout = timeout
        self.soft_timeout = soft_timeout
        self.guarantee = guarantee
        self.reply = reply
        self.on_commit = on_commit
        self.priority = priority
        self.unique, self.unique_for = check_unique(unique, unique_for)
        self.flow = FlowOptions(rate_limit, max_concurrency, concurrency_key)
        if unique or self.flow.per_call:  # delay(), map(): as apply_async() (unique_jobs.py)
            self.delay = lambda *a, **k: self.apply_async(a, k)  # type: ignore[method-assign]
            self.map = lambda calls: [apply_call(self, c) for c in calls]  # type: ignore[method-assign]
        self._headers = self._build_headers(
            reply, guarantee, retries, timeout, 0.0, soft_timeout, priority
        )
        self._queue_bytes = queue.encode()
        self._body = RunBodyEncoder(self.path, self.callable)
        # delay()'s path, made once: the headers as the client flags them, whether a
        # job may be coalesced (a guaranteed one waits for its ACK), the REQUESTS
        # record of a call without arguments around its msgid, and the handle's class
        flagged = with_acks_flag(self._headers)
        self._flagged = flagged
        self._pipelined = not guarantee and len(flagged) <= MAX_HEADERS_LENGTH
        empty = self._body.encode()
        q = self._queue_bytes
        self._empty = (empty, record_head(ID_CHARS, q, flagged, empty), q + flagged + empty)
        self._handle = SentResult.for_task(self.name, reply, plain=not guarantee)
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"<emq task {self.name} queue={self.queue}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def delay(self, *args: P.args, **kwargs: P.kwargs) -> Result:
        """Send the task with these arguments; see ``apply_async``."""
        # apply_async without options, on its shortest path (every line here costs
        # each job: bench/producer_cost.py): the headers, the queue's bytes and the
        # body's JSON around the arguments are the task's, made once, and so is the
        # whole body and its REQUESTS record of a call without arguments.
        settings = _conf._cached or _conf.cached_settings()
        if args or kwargs:
            body = self._body.encode(args, kwargs)
            head = tail = None
        else:
            body, head, tail = self._empty
        if len(body) > settings.MAX_BODY_BYTES:
            check_size(body, settings.MAX_BODY_BYTES, self.name)
        if self.on_commit and _in_transaction():
            return self.apply_async(args, kwargs)
        if settings.EAGER:
            return self._run_eagerly(body, self.reply)
        if otel.api._TRACER_PROVIDER is not None:  # a PRODUCER span: apply_async's
            return self.apply_async(args, kwargs)
        # get_client()'s fast path inline (a call per job: bench/profile_diff.py)
        proc = _client_process
        client = None if proc is None else proc._client
        if client is None or proc._client_pid != proc.lifetime._pid:
            client = _get_client()  # the first, or the first since a fork
        handle = _new_handle(self._handle)  # SentResult without an __init__ call
        changes = client.broker_changes  # a plain job is lost if it changes (JobLost)
        if changes and not self.guarantee:  # (0, the class's, until a broker restart)
            handle._sent_at_change = changes
        if self._pipelined:
            msgid = client.send_pipelined(
                self._queue_bytes, self._flagged, body, head, tail, not self.reply
            )
        else:
            msgid = client.send_request(self._queue_bytes, self._headers, body, confirm=True)
        handle._msgid = msgid
        if signals.job_sent.receivers:
            self._sent(msgid, self.queue, args, kwargs)
        return handle

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A signature of this task with these arguments (``emq.chain`` and co.): in
        a chain it gets the previous step's result as its first argument. Raises
        ``TypeError`` for arguments JSON cannot carry, ``TaskNotFound`` for a task
        not registered."""
        from emq_django.workflows import Signature

        return Signature(self.name, args, kwargs)

    def si(self, *args: Any, **kwargs: Any) -> Signature:
        """An immutable signature: it does not take the previous step's result."""
        from emq_django.workflows import Signature

        return Signature(self.name, args, kwargs, immutable=True)

    def delay_on_commit(self, *args: P.args, **kwargs: P.kwargs) -> Result:
        """Send the task once the surrounding transaction commits (never if it rolls
        back; at once outside a transaction): ``apply_async(..., on_commit=True)``."""
        return self.apply_async(args, kwargs, on_commit=True)

    def map(
        self, calls: Iterable[Sequence[Any] | tuple[Sequence[Any], Mapping[str, Any]]]
    ) -> list[Result]:
        """Send many calls at once, pipelined: ``add.map([(1, 2), (3, 4)])``, or
        ``(args, kwargs)`` pairs. A guaranteed task returns once the broker has
        ACKed them all, which is far faster than a ``delay()`` each. At most
        ``EMQ_ACK_WINDOW`` are unacknowledged at a time (guaranteed: one more
        goes as each ACK arrives, a sliding window), so a large iterable streams.

        Every job gets its id before anything is sent. If the broker stops
        acknowledging, the unacknowledged jobs are sent again under the same ids;
        after ``EMQ_ACK_TIMEOUT`` without an ACK it raises ``BatchUnacknowledged``,
        whose ``resend()`` sends exactly those again. Raises ``TypeError`` /
        ``ValueError`` for arguments the broker would refuse (docs: Refusals)."""
        from emq_django.client import get_client
        from emq_django.conf import cached_settings

        settings = cached_settings()
        bodies = []
        pairs: list[tuple[Any, Any]] = []  # (args, kwargs) of each call: job_sent's
        for call in calls:
            if (
                isinstance(call, tuple)
                and len(call) == 2
                and isinstance(call[1], Mapping)
                and isinstance(call[0], list | tuple)
            ):
                pairs.append((call[0], call[1]))
            else:
                pairs.append((call, None))
            body = encode_run_body(self.path, self.callable, *pairs[-1])
            bodies.append(check_size(body, settings.MAX_BODY_BYTES, self.name))
        if settings.EAGER:
            return [self._run_eagerly(body, self.reply) for body in bodies]
        client = get_client()
        ids = [client.new_id() for _ in bodies]  # before sending: a resend reuses them
        results = [Result(i, self.name, reply=self.reply, client=client) for i in ids]

        def send(headers: bytes) -> None:
            client.send_batch(
                self.queue,
                headers,
                bodies,
                ids,
                confirm=self.guarantee,
                results=results,
                noreply=not self.reply,
            )

        if otel.active():
            with otel.producing(self.name, self.queue) as sending:
                send(otel.with_trace(self._headers, sending.headers))
                sending.sent([i.decode() if isinstance(i, bytes) else str(i) for i in ids])
        else:
            send(self._headers)
        if signals.job_sent.receivers:
            for job_id, (args, kwargs) in zip(ids, pairs, strict=True):
                self._sent(job_id, self.queue, args, kwargs)
        return results

    def apply_async(
        self,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        queue: str | None = None,
        retries: int | None = None,
        timeout: float | None = None,
        guarantee: bool | None = None,
        reply: bool | None = None,
        countdown: float | None = None,
        eta: dt.datetime | None = None,
        job_id: str | None = None,
        on_commit: bool | None = None,
        soft_timeout: float | None = None,
        priority: int | None = None,
        unique_key: str | None = None,
        unique_for: float | None = None,
        concurrency_key: str | None = None,
    ) -> Result:
        """Send the task. Raises ``TypeError``/``ValueError`` for an option or
        arguments the broker would refuse (a negative or non-numeric ``timeout`` or
        ``retries``, a bad queue name, a non-finite or over-a-year ``countdown``/
        ``eta``, a ``soft_timeout`` not under the ``timeout``, a ``priority`` that
        is not an int from -100 to 100, arguments JSON cannot carry or nested over
        100 deep),
        ``BrokerUnavailable`` when the broker does not acknowledge in time and
        ``QueueFull``/``JobRefused`` when the broker refuses the job. With
        ``on_commit`` (default: the task's) inside a transaction, the job is sent
        when it commits (emq_django/transaction.py) and the result says so.
        ``unique_key``/``unique_for``: one job per key at a time (docs: Unique jobs);
        ``concurrency_key``: the task's ``max_concurrency`` per key (docs: Flow control)."""
        check_options(queue, retries, timeout, guarantee, reply, job_id)
        if priority is not None:
            check_priority(priority)
        if soft_timeout is not None or timeout is not None:
            check_soft_timeout(
                self.soft_timeout if soft_timeout is None else soft_timeout,
                self.timeout if timeout is None else timeout,
            )
        run_after = when_to_run(countdown, eta)  # bad timing fails now, not at commit
        unique = unique_of(self, unique_key, unique_for, args, kwargs)  # (key, for) or None
        key = self.flow.key_for(concurrency_key, args, kwargs)  # its concurrency key, or None
        body = self._body.encode(args, kwargs)
        settings = _settings()
        check_size(body, settings.MAX_BODY_BYTES, self.name)
        want_reply = self.reply if reply is None else reply
        if (self.on_commit if on_commit is None else on_commit) and _in_transaction():
            options = {
                "queue": queue,
                "retries": retries,
                "timeout": timeout,
                "soft_timeout": soft_timeout,
                "priority": priority,
                "unique_key": unique_key,
                "unique_for": unique_for,
                "concurrency_key": key,
                "guarantee": guarantee,
                "reply": want_reply,
                "countdown": countdown,
                "eta": eta,
            }
            from emq_django.transaction import send_on_commit

            return send_on_commit(self.apply_async, self.name, (args, kwargs), job_id, options)
        if settings.EAGER:
            return self._run_eagerly(body, want_reply)
        if (retries, timeout, guarantee, reply, run_after, soft_timeout, priority) == (
            None, None, None, None, 0.0, None, None,
        ) and unique is None and key is None:  # fmt: skip
            headers = self._headers
        else:
            headers = self._build_headers(
                want_reply,
                self.guarantee if guarantee is None else guarantee,
                self.retries if retries is None else retries,
                self.timeout if timeout is None else timeout,
                run_after,
                self.soft_timeout if soft_timeout is None else soft_timeout,
                self.priority if priority is None else priority,
            )
            if unique is not None:
                headers = with_key(headers, *unique)
            if key is not None:
                headers = with_concurrency_key(headers, key)
        confirm = self.guarantee if guarantee is None else guarantee
        client = _get_client()
        if unique is not None:  # waits for the broker's answer: a new job, or the existing one
            target, call = queue or self.queue, (args, kwargs)
            return send_unique(client, target, headers, body, self, job_id, want_reply, call)
        changes = client.broker_changes
        target = queue or self.queue
        if otel.api._TRACER_PROVIDER is not None:  # a PRODUCER span, its context in the headers
            with otel.producing(self.name, target) as sending:
                headers = otel.with_trace(headers, sending.headers)
                job_id = client.send(
                    target, headers, body, confirm=confirm, job_id=job_id, noreply=not want_reply
                )
                sending.sent([job_id])
        else:
            job_id = client.send(
                target, headers, body, confirm=confirm, job_id=job_id, noreply=not want_reply
            )
        result = Result(job_id, self.name, reply=want_reply, client=client)
        if signals.job_sent.receivers:
            self._sent(job_id, target, args, kwargs)
        if not confirm:  # a plain job: lost if the broker restarts (JobLost)
            result._sent_at_change = changes
        return result

    def _sent(self, msgid: Any, queue: str, args: Any, kwargs: Any) -> None:
        """``signals.job_sent``, when a receiver listens."""
        job_id = msgid.decode() if isinstance(msgid, bytes) else str(msgid)
        signals.send(
            signals.job_sent,
            self,
            job_id=job_id,
            attempt=0,
            task=self.name,
            queue=queue,
            args=list(args),
            kwargs=dict(kwargs or {}),
        )

    def _build_headers(
        self,
        reply: bool,
        guarantee: bool,
        retries: int,
        timeout: float,
        run_after: float,
        soft_timeout: float = 0,
        priority: int = 0,
    ) -> bytes:
        return format_headers(
            reply_requested=reply,
            guarantee=guarantee,
            retry_count=retries,
            timeout=timeout,
            run_after=run_after,
            task=self.name,
            stream=reply,  # its partial results come back too (Result.stream())
            priority=priority,
            **self.flow.header_options(),
            # read by the worker process alone (the broker forwards it unread)
            extra=((SOFT_TIMEOUT_HEADER, f"{soft_timeout:g}"),) if soft_timeout else (),
        )

    def _run_eagerly(self, body: bytes, reply: bool) -> Result:
        """``EMQ_EAGER``: run here and now, through the same JSON round trip."""
        return run_eagerly(self.fn, self.name, body)


def _settings() -> EmqSettings:
    return _conf._cached or _conf.cached_settings()


_client_module: Any = None  # emq_django.client, once loaded (lazily: it opens sockets)
# emq_django.client.process, whose this-process client (``_client``, ``_client_pid``
# against ``lifetime._pid``: a fork makes a new one) ``delay()`` reads inline
_client_process: Any = None
_new_handle = object.__new__


def _load_client_module() -> Any:
    """``emq_django.client``, kept for ``delay()``'s fast path (its public
    ``get_client()``: this process's client, checked against forks)."""
    global _client_module, _client_process
    _client_module = client_module()
    from emq_django.client import process

    _client_process = process
    return _client_module


def _get_client() -> Client:
    """This process's client."""
    return (_client_module or _load_client_module()).get_client()


def _in_transaction() -> bool:
    from emq_django.transaction import in_transaction

    return in_transaction()


@overload
def task(fn: Callable[P, R], /) -> Task[P, R]: ...
@overload
def task(
    *,
    queue: str = ...,
    retries: int = ...,
    timeout: float = ...,
    guarantee: bool = ...,
    reply: bool = ...,
    on_commit: bool = ...,
    soft_timeout: float = ...,
    priority: int = ...,
    unique: bool = ...,
    unique_for: float = ...,
    rate_limit: str | None = ...,
    max_concurrency: int | None = ...,
    concurrency_key: KeyOption = ...,
) -> Callable[[Callable[P, R]], Task[P, R]]: ...


def task(
    fn: Callable[P, R] | None = None,
    /,
    *,
    queue: str = "default",
    retries: int = 0,
    timeout: float = 0,
    guarantee: bool = False,
    reply: bool = True,
    on_commit: bool = False,
    soft_timeout: float = 0,
    priority: int = 0,
    unique: bool = False,
    unique_for: float = 0,
    rate_limit: str | None = None,
    max_concurrency: int | None = None,
    concurrency_key: KeyOption = None,
) -> Any:
    """Register ``fn`` as a task: ``@emq.task`` or ``@emq.task(queue="email", ...)``.
    ``on_commit=True``: inside a transaction, send only once it commits.
    ``timeout``: the hard time limit (the worker process is killed);
    ``soft_timeout``: ``SoftTimeLimitExceeded`` is raised inside the task;
    ``priority``: -100..100, higher first (docs: Priority); ``unique``: one job per
    task and arguments at a time (docs: Unique jobs); ``rate_limit`` ("100/s"),
    ``max_concurrency``, ``concurrency_key`` (a str, or a callable of the arguments):
    held back at the broker (docs: Flow control). Raises ``TypeError``/``ValueError``
    for an option out of range."""

    def wrap(f: Callable[P, R]) -> Task[P, R]:
        t = Task(
            f,
            queue=queue,
            retries=retries,
            timeout=timeout,
            guarantee=guarantee,
            reply=reply,
            on_commit=on_commit,
            soft_timeout=soft_timeout,
            priority=priority,
            unique=unique,
            unique_for=unique_for,
            rate_limit=rate_limit,
            max_concurrency=max_concurrency,
            concurrency_key=concurrency_key,
        )
        registry.register(t)
        return t

    return wrap(fn) if fn is not None else wrap
