"""The broker's own OpenTelemetry spans, when asked (``EMQ_OTEL_BROKER_SPANS``) and
a tracer provider is set in the broker process (its settings, or
``opentelemetry-instrument manage.py emq_broker``).

One span per attempt dispatched, ``dispatch <queue>``, the child of the job's
``traceparent`` (the client's ``PRODUCER`` span: a sibling of the worker's
``CONSUMER`` span), made whole when the attempt leaves for its worker: the first
attempt's starts when the broker accepted the job (its queue wait, a countdown
included), a later attempt's is a point at its dispatch (its back-off is in the
trace log). A job with no valid ``traceparent`` (sent with no tracer provider,
another client's) gets no span. The core calls ``dispatched`` only when this object
exists (``core.spans``): with the setting off the broker makes no call per job.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

if TYPE_CHECKING:
    from emq_django.broker.state import Job, Peer

log = logging.getLogger(__name__)

_SCOPE = "emq_django.broker"


class DispatchSpans:
    """Makes the ``dispatch <queue>`` spans through the tracer provider set now."""

    def __init__(self, provider: Any = None) -> None:
        """``provider``: the tracer provider (the one set in the process if None)."""
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._trace = trace
        self._tracer = (provider or trace.get_tracer_provider()).get_tracer(_SCOPE)
        self._propagator = TraceContextTextMapPropagator()
        self._kind = trace.SpanKind.INTERNAL
        self.made = 0  # spans made (the broker's stats)
        self.failed = 0  # spans that could not be made (logged)

    def dispatched(self, job: Job, wall: float, wall_offset: float, peer: Peer) -> None:
        """Attempt ``job.attempt`` of ``job`` left for ``peer`` at ``wall`` (Unix time):
        its span, if the job has a trace. Never raises."""
        h = job.headers
        if not h.extra:
            return
        traceparent = h.get("traceparent")
        if not traceparent:
            return
        try:
            carrier = {"traceparent": traceparent}
            state = h.get("tracestate")
            if state:
                carrier["tracestate"] = unquote(state)
            parent = self._propagator.extract(carrier)
            if not self._trace.get_current_span(parent).get_span_context().is_valid:
                return  # malformed: no parent to be the child of
            start = job.enqueued_at + wall_offset if job.attempt == 1 else wall
            attributes: dict[str, Any] = {
                "messaging.system": "emq",
                "messaging.operation.name": "dispatch",
                "messaging.destination.name": job.queue,
                "messaging.message.id": job.id.decode("utf-8", "replace"),
                "emq.attempt": job.attempt,
                "emq.task": h.task,
                "emq.job_manager": peer.manager_name or "",
                "emq.queue_wait_ms": round(max(wall - start, 0.0) * 1000.0, 3),
            }
            span = self._tracer.start_span(
                f"dispatch {job.queue}",
                context=parent,
                kind=self._kind,
                attributes=attributes,
                start_time=int(min(start, wall) * 1e9),
            )
            span.end(end_time=int(wall * 1e9))
            self.made += 1
        except Exception:
            self.failed += 1
            if self.failed == 1 or self.failed % 1000 == 0:  # not a line per job
                log.exception("could not make the broker's span (%d so far)", self.failed)


def dispatch_spans(enabled: bool) -> DispatchSpans | None:
    """The broker's spans when ``EMQ_OTEL_BROKER_SPANS`` is on and a tracer provider
    is set; None (and a warning that says why) when it is on but they cannot be."""
    if not enabled:
        return None
    try:
        from opentelemetry import trace
    except ImportError:
        log.warning(
            "EMQ_OTEL_BROKER_SPANS is on but opentelemetry-api is not installed "
            '(pip install "emq-django[otel]"): the broker makes no spans'
        )
        return None
    api: Any = trace
    if api._TRACER_PROVIDER is None:  # as emq_django.otel.active() reads it
        log.warning(
            "EMQ_OTEL_BROKER_SPANS is on but no tracer provider is set in the broker "
            "process (its settings, or opentelemetry-instrument): the broker makes no spans"
        )
        return None
    log.info("OpenTelemetry: the broker makes a span per attempt dispatched")
    return DispatchSpans()
