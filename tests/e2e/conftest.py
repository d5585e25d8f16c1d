"""``env``: the environment of the end-to-end tests whose job managers run
tests/e2e/flow_tasks.py (flow control, priority, unique jobs, the job manager
controls and figures). A test module with an ``env`` fixture of its own uses its own
(pytest: a module's fixture overrides a conftest's)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.environ import environment


@pytest.fixture
def env(
    emq_env: dict[str, str], emq_client_env: dict[str, str], tmp_path: Path
) -> Iterator[dict[str, str]]:
    extra = {
        "EMQ_IMPORTS": "tests.e2e.flow_tasks",
        "EMQ_FLOW_LOG": str(tmp_path / "flow.jsonl"),
        "EMQ_RECORDER": "",
    }
    with environment(emq_env, extra):
        yield emq_env
