"""Issue 35: the broker's own spans (``EMQ_OTEL_BROKER_SPANS``, broker/spans.py) with
the real OpenTelemetry SDK and an in-memory exporter, in the pure core: one
``dispatch <queue>`` span per attempt, the child of the job's ``traceparent``; none
for a job without a valid one; none at all when the core has no ``spans`` (the
setting off). The provider is the test's own: the process's stays unset, so no
other test starts tracing."""

from __future__ import annotations

from typing import Any

import pytest

from emq_django.broker.core import BrokerConfig
from emq_django.broker.effects import OK_READY, Deliver, Effect
from emq_django.broker.spans import DispatchSpans, dispatch_spans
from tests.support.core_harness import CoreHarness, failed

pytest.importorskip("opentelemetry.sdk")

TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"
WALL = 1_000_000.0


def dispatched(out: list[Effect]) -> list[bytes]:
    return [e.job.attempt_id for e in out if isinstance(e, Deliver)]


def traced() -> tuple[CoreHarness, Any]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    h = CoreHarness(BrokerConfig(retry_base=1.0, retry_cap=1.0), wall_offset=WALL, seed=1)
    h.core.spans = DispatchSpans(provider)
    meta = {"role": "slot", "manager": "jm-a", "pid": 1, "incarnation": "i1"}
    h.join(b"w", queues=((10, "q"),), meta=meta, now=0.0)
    return h, exporter


def test_one_span_per_attempt_dispatched_child_of_the_jobs_traceparent() -> None:
    h, exporter = traced()
    headers = f"retry-count:1,task:pkg.add,traceparent:00-{TRACE}-{PARENT}-01".encode()
    h.request(b"c", b"j1", queue="q", headers=headers, now=1.0)
    h.request(b"c", b"untraced", queue="q", headers=b"task:pkg.add", now=1.0)
    bad = b"task:pkg.add,traceparent:00-zz-not-a-span-01"
    h.request(b"c", b"bad", queue="q", headers=bad, now=1.0)
    out = h.ready(b"w", now=3.5)  # j1 waited 2.5 s
    todo = dispatched(out)
    assert todo == [b"j1#1"]
    now = 4.0
    while True:  # answer every attempt (j1's first fails), retries when due
        while todo:
            attempt_id = todo.pop(0)
            status = failed("ValueError") if attempt_id == b"j1#1" else OK_READY
            todo += dispatched(h.result(b"w", attempt_id, status, now=now))
        if not len(h.delayed):
            break
        now = h.delayed.next_due()
        todo += dispatched(h.tick(now, keep_alive=(b"w",)))
    assert h.counters["succeeded"] == 3

    spans = exporter.get_finished_spans()
    assert [s.attributes["emq.attempt"] for s in spans] == [1, 2]  # j1's only
    first, second = spans
    for span in spans:
        assert span.name == "dispatch q"
        assert span.context.trace_id == int(TRACE, 16)
        assert span.parent is not None and span.parent.span_id == int(PARENT, 16)
        assert span.attributes["messaging.system"] == "emq"
        assert span.attributes["messaging.destination.name"] == "q"
        assert span.attributes["messaging.message.id"] == "j1"
        assert span.attributes["emq.task"] == "pkg.add"
        assert span.attributes["emq.job_manager"] == "jm-a"
    # the first attempt's: from the broker's accepting the job to its dispatch
    assert first.start_time == pytest.approx((WALL + 1.0) * 1e9, abs=1e3)
    assert first.end_time == pytest.approx((WALL + 3.5) * 1e9, abs=1e3)
    assert first.attributes["emq.queue_wait_ms"] == pytest.approx(2500.0)
    # a retry's: a point at its dispatch
    assert second.start_time == second.end_time
    assert second.attributes["emq.queue_wait_ms"] == 0.0


def test_off_or_without_a_provider_there_is_no_spans_object() -> None:
    from opentelemetry import trace

    assert dispatch_spans(False) is None
    api: Any = trace
    if api._TRACER_PROVIDER is None:  # (as it is, unless a test before set one)
        # on, but this process has set no tracer provider: none, a warning says why
        assert dispatch_spans(True) is None
    assert CoreHarness().core.spans is None
