"""Failed jobs reach Sentry (issue 35): the real ``sentry-sdk`` in a real job manager
(tests/e2e/sentry_settings.py: ``sentry_sdk.init`` and ``emq_django.sentry.connect()``)
sends its envelopes to a tiny HTTP endpoint in this test, which reads them: each
failed attempt's exception arrives with the job id, task, attempt, queue and
outcome as tags."""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from emq_django.exceptions import TaskFailed
from tests.e2e import signal_tasks as tasks
from tests.e2e.test_spine import wait_jm_ready
from tests.support import EmqProcesses, free_tcp_port, start_broker, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


class SentryEndpoint(ThreadingHTTPServer):
    """Sentry's envelope endpoint, enough of it: every event item it is sent."""

    def __init__(self, port: int) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def take(self, body: bytes) -> None:
        lines = body.split(b"\n")
        # an envelope: its header, then (item header, payload) pairs
        for head, payload in zip(lines[1::2], lines[2::2], strict=False):
            if head and json.loads(head).get("type") == "event":
                with self.lock:
                    self.events.append(json.loads(payload))


class _Handler(BaseHTTPRequestHandler):
    server: SentryEndpoint

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if self.path.endswith("/envelope/"):
            self.server.take(body)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[SentryEndpoint]:
    server = SentryEndpoint(free_tcp_port())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_failed_attempts_reach_sentry_with_the_job_as_tags(
    emq_processes: EmqProcesses,
    emq_client_env: dict[str, str],
    endpoint: SentryEndpoint,
) -> None:
    env = {
        **emq_client_env,
        "EMQ_IMPORTS": "tests.e2e.signal_tasks",
        "EMQ_RETRY_BASE": "0.2",
        "EMQ_RETRY_CAP": "1",
        "EMQ_RECORDER": "",
    }
    broker = start_broker(emq_processes, env)
    dsn = f"http://public@127.0.0.1:{endpoint.server_port}/7"
    jm = emq_processes.start(
        "emq_jobmanager",
        "--queues",
        "signals",
        "--concurrency",
        "1",
        "--name",
        "sentry",
        env={
            **env,
            "DJANGO_SETTINGS_MODULE": "tests.e2e.sentry_settings",
            "EMQ_TEST_SENTRY_DSN": dsn,
        },
    )
    wait_jm_ready(env, "sentry", 1, [broker, jm])
    doomed = tasks.doomed.apply_async(("to-sentry",), job_id="to-sentry")  # retries=2
    with pytest.raises(TaskFailed):
        doomed.get(timeout=60)

    def ours() -> list[dict[str, Any]]:
        with endpoint.lock:
            found = [e for e in endpoint.events if "emq.job_id" in e.get("tags", {})]
        return sorted(found, key=lambda e: int(e["tags"]["emq.attempt"]))

    wait_until(lambda: len(ours()) == 3, "three events in Sentry", 60, [broker, jm])
    events = ours()
    for attempt, event in enumerate(events, 1):
        assert event["tags"]["emq.job_id"] == "to-sentry"
        assert event["tags"]["emq.attempt"] == str(attempt)
        assert event["tags"]["emq.task"] == "tests.e2e.signal_tasks.doomed"
        assert event["tags"]["emq.queue"] == "signals"
        (exc,) = event["exception"]["values"]
        assert (exc["type"], exc["value"]) == ("KeyError", "'to-sentry'")
        frames = exc["stacktrace"]["frames"]
        assert frames[-1]["function"] == "doomed"  # the task's own frame
    assert [e["tags"]["emq.outcome"] for e in events] == ["retrying", "retrying", "dead_lettered"]
    assert [e["level"] for e in events] == ["warning", "warning", "error"]
