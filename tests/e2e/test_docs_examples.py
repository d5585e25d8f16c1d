"""The docs' examples that need a broker (``<!-- docs-test: runs-in:
tests/e2e/test_docs_examples.py -->``), run against a real ``emq_broker`` started
here on private ports (and a job manager where the page's example has tasks).

The pages name the default addresses (``tcp://127.0.0.1:5555``); the broker here
binds free ports, so each default ``*_BIND`` address in an example is replaced by
this broker's before it runs. A block whose first line is ``# <path>.py`` is a file
of the user's project: it is written under the test's directory (importable by the
job manager), not run here.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import pytest

from emq_django.settings_registry import EmqSettings
from tests.docs_examples import Example, close_sockets, examples_run_in, run_example
from tests.e2e.test_spine import wait_jm_ready
from tests.support import REPO_ROOT, EmqProcesses, ManagedProcess, start_broker

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

HERE = "tests/e2e/test_docs_examples.py"
FILE_BLOCK = re.compile(r"# (?P<path>[\w/]+\.py)\b")

# The pages whose examples run here, and the queues of their projects' job managers.
PAGES = {"docs/protocols/topics.md": "", "docs/protocols/majordomo.md": "reports:4"}


def page_examples(page: str) -> list[Example]:
    return [e for e in examples_run_in(HERE) if e.page == page]


def with_private_addresses(code: str, env: dict[str, str]) -> str:
    """``code`` with every default bind address of the settings made this broker's."""
    for field in dataclasses.fields(EmqSettings):
        if field.name.endswith("_BIND") and isinstance(field.default, str) and field.default:
            code = code.replace(field.default, env[f"EMQ_{field.name}"])
    return code


def python_path(project: Path) -> str:
    """The job manager's: the project's files first, then the repository (the
    example project's settings) and what this process has."""
    parts = [str(project), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
    return os.pathsep.join(p for p in parts if p)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """Where the examples' project files go (on the job manager's path)."""
    root = tmp_path / "project"
    root.mkdir()
    return root


@pytest.fixture
def broker(emq_processes: EmqProcesses, emq_client_env: dict[str, str]) -> ManagedProcess:
    """The broker, on the private addresses this test process's client uses too."""
    env = emq_client_env
    proc = start_broker(emq_processes, env)
    for key in ("EMQ_MDP_BIND", "EMQ_BUS_SNAPSHOT_BIND"):
        emq_processes.wait_for_port(int(env[key].rsplit(":", 1)[1]), proc=proc)
    return proc


def test_every_example_that_names_this_file_is_on_a_page_it_runs() -> None:
    examples = examples_run_in(HERE)
    assert {e.page for e in examples} == set(PAGES)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_page_s_examples_run_against_a_broker(
    page: str,
    emq_processes: EmqProcesses,
    emq_client_env: dict[str, str],
    broker: ManagedProcess,
    project: Path,
) -> None:
    env = emq_client_env
    examples = page_examples(page)
    files = [e for e in examples if FILE_BLOCK.match(e.code)]
    for example in files:
        path = project / FILE_BLOCK.match(example.code)["path"]  # type: ignore[index]
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(example.code)
    if PAGES[page]:
        modules = [
            FILE_BLOCK.match(e.code)["path"].removesuffix(".py").replace("/", ".")  # type: ignore[index]
            for e in files
        ]
        jm = emq_processes.start(
            "emq_jobmanager",
            "--queues",
            PAGES[page],
            "--concurrency",
            "1",
            "--name",
            "docs",
            env={"EMQ_IMPORTS": ",".join(modules), "PYTHONPATH": python_path(project)},
        )
        wait_jm_ready(env, "docs", 1, [broker, jm])
    module = "example_" + page.removesuffix(".md").replace("/", "_")
    namespace: dict[str, object] = {"__name__": module}
    try:
        for example in examples:
            if example not in files:
                private = dataclasses.replace(
                    example,
                    code=with_private_addresses(example.code, env),
                    setup=with_private_addresses(example.setup, env),
                    then=with_private_addresses(example.then, env),
                )
                run_example(private, namespace)
    finally:
        close_sockets(namespace)
