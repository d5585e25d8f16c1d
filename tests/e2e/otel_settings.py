"""The example project with the OpenTelemetry SDK configured in its settings, as an
application would (tests/e2e/test_otel.py runs a job manager with it): the real
``ConsoleSpanExporter``, one JSON span per line, appended to the file named by
``EMQ_OTEL_SPANS`` (one O_APPEND write per span: the worker processes' lines never
mix)."""

import os

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from project.settings import *  # noqa: F403


class _AppendFile:
    """A text stream whose every write is one ``os.write`` to an O_APPEND file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, text: str) -> int:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            return os.write(fd, text.encode())
        finally:
            os.close(fd)

    def flush(self) -> None:
        pass


def _one_line(span: ReadableSpan) -> str:
    return span.to_json(indent=None) + "\n"


if os.environ.get("EMQ_OTEL_SPANS"):
    _provider = TracerProvider(resource=Resource.create({"service.name": "emq-jobmanager"}))
    _exporter = ConsoleSpanExporter(
        out=_AppendFile(os.environ["EMQ_OTEL_SPANS"]),  # type: ignore[arg-type]
        formatter=_one_line,
    )
    _provider.add_span_processor(SimpleSpanProcessor(_exporter))
    trace.set_tracer_provider(_provider)
