"""OpenTelemetry (the ``otel`` extra: ``opentelemetry-api``), when the application
has set a tracer provider; nothing at all otherwise.

- The client: ``delay()``/``apply_async()``/``map()`` run in a ``PRODUCER`` span
  (``send <queue>``) whose W3C context goes into the job's headers:
  ``traceparent:<value>``, ``tracestate:<value, percent-encoded>`` and
  ``sent-at:<unix time>`` (docs/eventmq-wire.md, "Trace context").
- The worker process: each attempt runs in a ``CONSUMER`` span (``process
  <queue>``), the producer's child, current while the task runs (so that the
  task's own spans are its children), with the messaging semantic-convention
  attributes and ``emq.*`` ones (``ATTRIBUTES`` in docs/features/observability.md);
  each partial is a span event. A failed attempt's REPLY names its span
  (``span:<traceparent>`` in the status) when the job has no ``first-attempt``
  header yet; the broker adds that header to the job for its retries, and each
  retry's span links to the first attempt's (docs/eventmq-wire.md, section 8).
- A malformed ``traceparent`` is ignored: the attempt starts a new trace.

``active()``: whether the API is installed and a tracer provider was set; the hot
paths read the same attribute in place (below).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from emq_django.ids import split_attempt
from emq_django.protocol.headers import FIRST_ATTEMPT

if TYPE_CHECKING:
    from collections.abc import Iterator

    from emq_django.protocol.headers import Headers


class _NoApi:
    """Stands for ``opentelemetry.trace`` where the otel extra is not installed."""

    _TRACER_PROVIDER = None


try:
    from opentelemetry import context as _context
    from opentelemetry import trace as _trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    api: Any = _trace
except ImportError:  # the otel extra is not installed
    api = _NoApi

# The hot paths (the client's send, the worker loop) test
# ``otel.api._TRACER_PROVIDER is not None`` in place of calling ``active()``: two
# attribute reads, no call. It is the API's own record of ``set_tracer_provider``
# (None until then), which its ``get_tracer_provider`` reads too.

log = logging.getLogger(__name__)

SYSTEM = "emq"
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
SENT_AT = "sent-at"
_SCOPE = "emq_django"


def active() -> bool:
    """Whether spans are made: the API is installed and a tracer provider is set."""
    return api._TRACER_PROVIDER is not None


_tracers: dict[int, Any] = {}  # the provider's id -> our tracer from it


def _tracer() -> Any:
    provider = _trace.get_tracer_provider()
    tracer = _tracers.get(id(provider))
    if tracer is None:
        tracer = _tracers[id(provider)] = provider.get_tracer(_SCOPE)
    return tracer


# ---- the client ---------------------------------------------------------------------


@dataclass(slots=True)
class Sending:
    """A producer span being sent: the headers to add, and the span to name the job."""

    span: Any
    headers: bytes  # ``,traceparent:...`` to append to the job's headers

    def sent(self, job_ids: list[str]) -> None:
        if len(job_ids) == 1:
            self.span.set_attribute("messaging.message.id", job_ids[0])
        else:
            self.span.set_attribute("messaging.batch.message_count", len(job_ids))


@contextmanager
def producing(task: str, queue: str) -> Iterator[Sending]:
    """The ``PRODUCER`` span around sending jobs of ``task`` to ``queue``."""
    attributes = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": queue,
        "emq.task": task,
    }
    kind = _trace.SpanKind.PRODUCER
    with _tracer().start_as_current_span(f"send {queue}", kind=kind, attributes=attributes) as span:
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
        items = [f"{TRACEPARENT}:{carrier[TRACEPARENT]}"] if TRACEPARENT in carrier else []
        if carrier.get(TRACESTATE):
            items.append(f"{TRACESTATE}:{quote(carrier[TRACESTATE], safe='=')}")
        items.append(f"{SENT_AT}:{time.time():.6f}")
        yield Sending(span, ("," + ",".join(items)).encode())


def with_trace(headers: bytes, extra: bytes) -> bytes:
    """``headers`` with a producer span's items appended (``Sending.headers``)."""
    return headers + extra if headers else extra[1:]


# ---- the worker process -------------------------------------------------------------


@dataclass(slots=True)
class Consuming:
    """The ``CONSUMER`` span of the attempt this worker process runs."""

    span: Any
    token: Any  # the context attached while the task runs
    first: bool  # the job has no first attempt's span yet: a failure's REPLY names this one


def _parent(h: Headers) -> Any:
    """The producer's context from the job's headers; an empty one (a new trace) when
    they carry none or a malformed one."""
    carrier = {TRACEPARENT: h.get(TRACEPARENT) or ""}
    state = h.get(TRACESTATE)
    if state:
        carrier[TRACESTATE] = unquote(state)
    return TraceContextTextMapPropagator().extract(carrier)


def _first_attempt(h: Headers) -> Any:
    """The span context of the job's first traced attempt (its ``first-attempt``
    header, in ``traceparent`` form), or None when it has none or a malformed one."""
    value = h.get(FIRST_ATTEMPT)
    if not value:
        return None
    context = TraceContextTextMapPropagator().extract({TRACEPARENT: value})
    span = _trace.get_current_span(context).get_span_context()
    return span if span.is_valid else None


def _queue_wait(h: Headers) -> float | None:
    try:
        sent = float(h.get(SENT_AT) or "nan")
    except ValueError:
        return None
    wait = time.time() - sent
    return wait * 1000.0 if wait == wait else None  # (nan: no sent-at)


def consuming(msgid: bytes, queue: str, h: Headers) -> Consuming | None:
    """Start the attempt's ``CONSUMER`` span and make it current. Never raises: a
    failure here is logged and the job runs untraced."""
    try:
        job_id, attempt = split_attempt(msgid)
        parent = _parent(h)
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": queue,
            "messaging.message.id": job_id,
            "emq.attempt": attempt,
            "emq.task": h.task,
        }
        wait = _queue_wait(h)
        if wait is not None:
            attributes["emq.queue_wait_ms"] = round(wait, 3)
        links = []
        first = _first_attempt(h) if h.extra else None
        if first is not None:
            links.append(_trace.Link(first, {"emq.link": "retry", "emq.attempt": attempt}))
        span = _tracer().start_span(
            f"process {queue}",
            context=parent,
            kind=_trace.SpanKind.CONSUMER,
            attributes=attributes,
            links=links,
        )
        token = _context.attach(_trace.set_span_in_context(span))
    except Exception:
        log.exception("could not start the trace span of job %s", msgid.decode(errors="replace"))
        return None
    return Consuming(span, token, first is None and h.get(FIRST_ATTEMPT) is None)


def reference(consuming: Consuming) -> bytes:
    """The attempt's span in W3C ``traceparent`` form (``00-<trace>-<span>-<flags>``),
    for the REPLY of a failed attempt; b'' when it is not a valid span."""
    try:
        ctx = consuming.span.get_span_context()
        if not ctx.is_valid:
            return b""
        return b"00-%032x-%016x-%02x" % (ctx.trace_id, ctx.span_id, int(ctx.trace_flags))
    except Exception:
        log.exception("could not read a job's trace span")
        return b""


def consumed(consuming: Consuming, outcome: str, error: str, exc: BaseException | None) -> None:
    """End the attempt's span with ``outcome`` (succeeded, retrying, dead_lettered,
    failed, cancelled). Never raises."""
    span = consuming.span
    try:
        _context.detach(consuming.token)
        span.set_attribute("emq.outcome", outcome)
        if outcome != "succeeded":
            if exc is not None:
                span.record_exception(exc)
            span.set_status(_trace.Status(_trace.StatusCode.ERROR, error or outcome))
            if error:
                span.set_attribute("error.type", error)
        span.end()
    except Exception:
        log.exception("could not end a job's trace span")


def partial(consuming: Consuming, index: int) -> None:
    """A partial result of the attempt went out: an event on its span."""
    consuming.span.add_event("emq.partial", {"emq.partial.index": index})
