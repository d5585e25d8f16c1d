"""The example project with OpenTelemetry's SDK on, for ``bench/run.py --emq-otel``
(``bench/otel_cost.py``): a tracer provider with the batch span processor, as
docs/features/observability.md configures it, and an exporter that drops the
spans (the cost measured is making and batching them, not a collector's)."""

from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from project.settings import *  # noqa: F403


class DroppingExporter(SpanExporter):
    """Counts nothing, sends nothing: a collector's cost is not ours."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


_provider = TracerProvider(resource=Resource.create({"service.name": "emq-bench"}))
_provider.add_span_processor(BatchSpanProcessor(DroppingExporter()))
trace.set_tracer_provider(_provider)
