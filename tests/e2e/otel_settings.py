"""The example project with the OpenTelemetry SDK configured in its settings, as
docs/features/observability.md shows it (its example, marked ``runs-in:
tests/e2e/test_otel.py``, is run here): the batch span processor and the console
exporter, whose spans tests/e2e/test_otel.py reads from the job manager's stdout."""

from project.settings import *  # noqa: F403
from tests.docs_examples import examples_run_in, run_example

(_example,) = examples_run_in("tests/e2e/test_otel.py")
run_example(_example, {"__name__": "otel_settings_example"})
