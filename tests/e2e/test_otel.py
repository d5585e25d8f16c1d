"""OpenTelemetry from delay() to the worker (issue 35), with the real SDK: an
in-memory exporter in the producer process (a ``manage.py shell`` that sets its
tracer provider), the console exporter in a real job manager whose settings
configure the SDK as docs/features/observability.md shows it
(tests/e2e/otel_settings.py runs that example). The worker's span is the
producer's child, with the messaging attributes; a retried job's later attempts
link to its first attempt's span; partials are span events; a malformed traceparent
from another client starts a new trace and the job runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_spine import run_manage, tagged, wait_jm_ready
from tests.support import EmqProcesses, ManagedProcess, start_broker, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

PRODUCER = """
import json
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from emq_django.client import get_client
from emq_django.handles import Result
from emq_django.protocol.body import encode_run_body
from emq_django.protocol.headers import format_headers
from tests.e2e import signal_tasks as t

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

with trace.get_tracer("test").start_as_current_span("request"):
    ok = t.streams.delay("otel-ok")
    flaky = t.flaky.apply_async(("otel-flaky",), job_id="otel-flaky")
print("OK=" + json.dumps([ok.id, ok.get(timeout=60)]))
print("FLAKY=" + json.dumps(flaky.get(timeout=60)))

# another client's job, its traceparent malformed: sent without a span of ours
headers = format_headers(
    reply_requested=True, task=t.streams.name, extra=(("traceparent", "00-zz-not-a-span-01"),)
)
client = get_client()
body = encode_run_body(t.streams.__module__, "streams", ["otel-bad"])
job = client.send("signals", headers, body, job_id="otel-bad")
print("BAD=" + json.dumps(Result(job, t.streams.name, reply=True, client=client).get(timeout=60)))

spans = [json.loads(s.to_json(indent=None)) for s in exporter.get_finished_spans()]
print("SPANS=" + json.dumps(spans))
"""


@pytest.fixture
def env(emq_env: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    emq_env.update(
        {
            "EMQ_IMPORTS": "tests.e2e.signal_tasks",
            "EMQ_SIGNAL_LOG": str(tmp_path / "signals.jsonl"),  # flaky counts its runs
            "EMQ_RETRY_BASE": "0.2",
            "EMQ_RETRY_CAP": "1",
            "EMQ_RECORDER": "",
            "EMQ_TRACE_DIR": str(tmp_path / "trace"),
        }
    )
    yield emq_env


def worker_spans(jm: ManagedProcess) -> list[dict[str, Any]]:
    """The spans the console exporter wrote to the job manager's stdout (JSON
    objects one after the other, each over several lines)."""
    text, spans, at = jm.stdout(), [], 0
    decoder = json.JSONDecoder()
    while True:
        start = text.find("{", at)
        if start < 0:
            return spans
        try:
            span, at = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            return spans  # a span being written
        spans.append(span)


def of_job(spans: list[dict[str, Any]], job_id: str) -> list[dict[str, Any]]:
    found = [s for s in spans if s["attributes"].get("messaging.message.id") == job_id]
    return sorted(found, key=lambda s: s["attributes"].get("emq.attempt", 0))


def test_worker_span_is_the_producer_span_child_with_attributes_links_and_events(
    emq_processes: EmqProcesses, env: dict[str, str]
) -> None:
    broker = start_broker(emq_processes, env, extra_env=env)
    jm = emq_processes.start(
        "emq_jobmanager",
        "--queues",
        "signals",
        "--concurrency",
        "1",
        "--name",
        "otel",
        env={**env, "DJANGO_SETTINGS_MODULE": "tests.e2e.otel_settings"},
    )
    wait_jm_ready(env, "otel", 1, [broker, jm])
    out = run_manage(env, "shell", "-c", PRODUCER, timeout=120)
    assert out.returncode == 0, out.stderr
    ok_id, ok_value = tagged(out.stdout, "OK")
    assert ok_value == "otel-ok done"
    assert tagged(out.stdout, "FLAKY") == "otel-flaky ok"
    assert tagged(out.stdout, "BAD") == "otel-bad done"
    request = next(s for s in tagged(out.stdout, "SPANS") if s["name"] == "request")
    wait_until(
        lambda: (
            len(of_job(worker_spans(jm), "otel-flaky")) == 3
            and of_job(worker_spans(jm), ok_id)
            and of_job(worker_spans(jm), "otel-bad")
        ),
        "the worker's spans",
        60,
        [broker, jm],
    )
    spans = worker_spans(jm)

    # the producer's spans: children of the caller's, one per job, PRODUCER
    sends = sorted(
        (s for s in tagged(out.stdout, "SPANS") if s["name"] == "send signals"),
        key=lambda s: s["start_time"],
    )
    assert len(sends) == 2
    for send, job_id in zip(sends, [ok_id, "otel-flaky"], strict=True):
        assert send["kind"] == "SpanKind.PRODUCER"
        assert send["parent_id"] == request["context"]["span_id"]
        assert send["context"]["trace_id"] == request["context"]["trace_id"]
        assert send["attributes"]["messaging.message.id"] == job_id
        assert send["attributes"]["messaging.system"] == "emq"
        assert send["attributes"]["messaging.destination.name"] == "signals"
    ok_send, flaky_send = sends

    # the worker's: the producer's child, CONSUMER, with the attributes
    (ok,) = of_job(spans, ok_id)
    assert ok["name"] == "process signals"
    assert ok["kind"] == "SpanKind.CONSUMER"
    assert ok["context"]["trace_id"] == ok_send["context"]["trace_id"]
    assert ok["parent_id"] == ok_send["context"]["span_id"]
    attrs = ok["attributes"]
    assert attrs["messaging.system"] == "emq"
    assert attrs["messaging.destination.name"] == "signals"
    assert attrs["messaging.operation.type"] == "process"
    assert attrs["emq.attempt"] == 1
    assert attrs["emq.task"] == "tests.e2e.signal_tasks.streams"
    assert attrs["emq.outcome"] == "succeeded"
    assert attrs["emq.queue_wait_ms"] >= 0
    assert [e["name"] for e in ok["events"]] == ["emq.partial", "emq.partial"]
    assert [e["attributes"]["emq.partial.index"] for e in ok["events"]] == [1, 2]
    assert ok["status"]["status_code"] == "UNSET"
    assert ok["resource"]["attributes"]["service.name"] == "mysite"  # the docs' example

    # a retried job: three attempts under the producer's span, the later ones linked
    attempts = of_job(spans, "otel-flaky")
    assert [s["attributes"]["emq.attempt"] for s in attempts] == [1, 2, 3]
    assert [s["attributes"]["emq.outcome"] for s in attempts] == [
        "retrying",
        "retrying",
        "succeeded",
    ]
    for span in attempts:
        assert span["context"]["trace_id"] == flaky_send["context"]["trace_id"]
        assert span["parent_id"] == flaky_send["context"]["span_id"]
    # a retried job's later attempts link to its first attempt's span: the failure
    # REPLY named it, the broker kept it with the job (the first-attempt header)
    first = attempts[0]
    assert first["links"] == []
    for n, span in enumerate(attempts[1:], start=2):
        (link,) = span["links"]
        assert link["context"]["span_id"] == first["context"]["span_id"]
        assert link["context"]["trace_id"] == first["context"]["trace_id"]
        assert link["attributes"] == {"emq.link": "retry", "emq.attempt": n}
    failed = attempts[0]
    assert failed["status"]["status_code"] == "ERROR"
    assert failed["attributes"]["error.type"] == "ValueError"
    assert [e["name"] for e in failed["events"]] == ["exception"]

    # the broker's trace names each job's trace (the admin's link, EMQ_TRACE_URL)
    enqueued = {
        e["job"]: e.get("otel")
        for path in sorted(Path(env["EMQ_TRACE_DIR"]).glob("trace-*.jsonl"))
        for e in map(json.loads, path.read_text().splitlines())
        if e["event"] == "enqueued"
    }
    assert enqueued[ok_id] == ok_send["context"]["trace_id"].removeprefix("0x")
    assert enqueued["otel-flaky"] == flaky_send["context"]["trace_id"].removeprefix("0x")
    assert enqueued["otel-bad"] is None  # malformed: no trace id

    # a malformed traceparent: a new trace, no parent, and the job ran
    (bad,) = of_job(spans, "otel-bad")
    assert bad["parent_id"] is None
    assert bad["context"]["trace_id"] not in {s["context"]["trace_id"] for s in sends}
    assert bad["attributes"]["emq.outcome"] == "succeeded"
    assert "emq.queue_wait_ms" not in bad["attributes"]


@pytest.mark.parametrize("spans", [True, False], ids=["broker-spans", "no-broker-spans"])
def test_broker_spans_only_when_asked(
    emq_processes: EmqProcesses, env: dict[str, str], spans: bool
) -> None:
    """EMQ_OTEL_BROKER_SPANS with the SDK configured in the broker's settings (the
    console exporter, its batch processor flushed when the broker exits): one
    ``dispatch <queue>`` span per attempt, the producer span's child; none for a job
    with no valid traceparent; with the setting off, none at all."""
    broker_env = {**env, "DJANGO_SETTINGS_MODULE": "tests.e2e.otel_settings"}
    if spans:
        broker_env["EMQ_OTEL_BROKER_SPANS"] = "1"
    broker = start_broker(emq_processes, env, extra_env=broker_env)
    jm = emq_processes.start(
        "emq_jobmanager", "--queues", "signals", "--concurrency", "1", "--name", "plain", env=env
    )
    wait_jm_ready(env, "plain", 1, [broker, jm])
    out = run_manage(env, "shell", "-c", PRODUCER, timeout=120)
    assert out.returncode == 0, out.stderr
    assert tagged(out.stdout, "FLAKY") == "otel-flaky ok"
    assert emq_processes.stop(broker) == 0, broker.log_tail()
    made = worker_spans(broker)  # the console exporter's, as the job manager's
    if not spans:
        assert made == []
        return
    ok_id, _ = tagged(out.stdout, "OK")
    sends = {
        s["attributes"]["messaging.message.id"]: s
        for s in tagged(out.stdout, "SPANS")
        if s["name"] == "send signals"
    }
    assert {s["attributes"]["messaging.message.id"] for s in made} == {ok_id, "otel-flaky"}
    for job_id, attempts in ((ok_id, [1]), ("otel-flaky", [1, 2, 3])):
        send = sends[job_id]
        mine = of_job(made, job_id)
        assert [s["attributes"]["emq.attempt"] for s in mine] == attempts
        for span in mine:
            assert span["name"] == "dispatch signals"
            assert span["kind"] == "SpanKind.INTERNAL"
            assert span["context"]["trace_id"] == send["context"]["trace_id"]
            assert span["parent_id"] == send["context"]["span_id"]
            attrs = span["attributes"]
            assert attrs["messaging.system"] == "emq"
            assert attrs["messaging.operation.name"] == "dispatch"
            assert attrs["messaging.destination.name"] == "signals"
            assert attrs["emq.job_manager"] == "plain"
            assert attrs["emq.queue_wait_ms"] >= 0
        assert mine[0]["attributes"]["emq.task"] == send["attributes"]["emq.task"]
        assert span["resource"]["attributes"]["service.name"] == "mysite"
