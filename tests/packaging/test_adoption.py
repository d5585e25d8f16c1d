"""The docs' "Use it in your project" (docs/getting-started.md), followed in a fresh
project installed from the wheel: `check` passes, and names the missing pieces when
they are missing; `migrate` runs; the page's pytest example runs a task under EMQ_EAGER; and the
installed `manage.py emq_broker` + `emq_jobmanager` (on free loopback ports) run a
task sent from `manage.py shell`, whose history row the recorder writes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docs_examples import examples_run_in
from tests.packaging.conftest import InstalledWheel
from tests.support import REPO_ROOT, free_tcp_ports, port_accepts

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

FENCE = re.compile(r"^```[a-z]*\n(.*?)^```\n", re.S | re.M)


def readme_files() -> dict[str, str]:
    """The section's code blocks that start with `# <relative path>`: path -> text."""
    readme = (REPO_ROOT / "docs" / "getting-started.md").read_text()
    section = readme.split("## Use it in your project\n", 1)[1].split("\n## ", 1)[0]
    files = {}
    for block in FENCE.findall(section):
        first, _, rest = block.partition("\n")
        path = first.removeprefix("# ").strip()
        if first.startswith("# ") and not path.startswith("/") and " " not in path:
            files[path] = rest
    return files


def test_readme_section_names_the_files_a_project_needs() -> None:
    assert set(readme_files()) == {
        "mysite/settings.py",
        "mysite/urls.py",
        "shop/tasks.py",
        "pytest.ini",
        "test_shop.py",
    }


def test_the_docs_example_marked_for_this_file_is_the_test_module_it_writes() -> None:
    """The page's pytest example (``runs-in`` this file: it imports the fresh project's
    ``shop.tasks``, so the docs runner cannot run it) is the test_shop.py that
    make_site writes and the adoption test runs with pytest there."""
    [example] = examples_run_in("tests/packaging/test_adoption.py")
    assert example.page == "docs/getting-started.md"
    first, _, code = example.code.partition("\n")
    assert (first, readme_files()["test_shop.py"]) == ("# test_shop.py", code)


def make_site(installed_wheel: InstalledWheel, tmp_path: Path) -> Path:
    """`startproject mysite` + `startapp shop`, then the page's files."""
    site = tmp_path / "site"
    site.mkdir()
    installed_wheel.run("django-admin", "startproject", "mysite", str(site), cwd=tmp_path)
    installed_wheel.run("python", "manage.py", "startapp", "shop", cwd=site)
    for path, text in readme_files().items():
        target = site / path
        if target.exists():  # settings.py and urls.py: add to what startproject wrote
            target.write_text(target.read_text() + "\n" + text)
        else:
            target.write_text(text)
    return site


def test_a_fresh_project_follows_the_readme_checks_migrates_and_runs_a_task(
    installed_wheel: InstalledWheel, tmp_path: Path
) -> None:
    site = make_site(installed_wheel, tmp_path)
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}

    check = installed_wheel.run("python", "manage.py", "check", cwd=site, env=env)
    assert "System check identified no issues" in check.stdout, check.stdout + check.stderr

    # Without the results app, while EMQ_RECORDER writes to its table; without the
    # emq_django app; without the URL include while the metrics token is set:
    (site / "mysite" / "settings_missing.py").write_text(
        "from mysite.settings import *  # noqa\n"
        "INSTALLED_APPS = [a for a in INSTALLED_APPS if a not in "
        "('emq_django', 'emq_django.results')]\n"
        "ROOT_URLCONF = 'mysite.urls_plain'  # its include would import the missing app\n"
    )
    (site / "mysite" / "urls_plain.py").write_text(
        "from django.contrib import admin\nfrom django.urls import path\n"
        "urlpatterns = [path('admin/', admin.site.urls)]\n"
    )
    (site / "mysite" / "settings_nourls.py").write_text(
        "from mysite.settings import *  # noqa\n"
        "ROOT_URLCONF = 'mysite.urls_plain'\nEMQ_METRICS_TOKEN = 'secret'\n"
    )
    missing = installed_wheel.run(
        "python",
        "manage.py",
        "check",
        "--settings",
        "mysite.settings_missing",
        cwd=site,
        env=env,
        check=False,
    )
    report = missing.stdout + missing.stderr
    assert missing.returncode != 0, report
    assert "emq.E002" in report and "'emq_django' is not in INSTALLED_APPS" in report, report
    assert "emq.E003" in report and "'emq_django.results' is not in INSTALLED_APPS" in report
    nourls = installed_wheel.run(
        "python",
        "manage.py",
        "check",
        "--settings",
        "mysite.settings_nourls",
        cwd=site,
        env=env,
    )
    report = nourls.stdout + nourls.stderr
    assert "emq.W001" in report and 'include("emq_django.results.urls")' in report, report

    installed_wheel.run("python", "manage.py", "migrate", "-v", "0", cwd=site, env=env)
    tests = installed_wheel.run("pytest", "-q", "-p", "no:cacheprovider", cwd=site, env=env)
    assert "1 passed" in tests.stdout, tests.stdout  # test_shop.py: the page's example


SEND = """
import json, time
from emq_django.results.models import JobResult
from shop.tasks import add
result = add.delay(2, 3)
value = result.get(timeout=30)
# the job manager's recorder writes the history every 0.2 s, or up to 10 s later while
# the CPUs are busy (EMQ_RECORDER_MAX_DELAY: it runs under SCHED_IDLE)
for _ in range(300):
    row = JobResult.objects.filter(pk=result.id).first()
    if row is not None:
        break
    time.sleep(0.1)
status, jm = (row.status, row.job_manager) if row else (None, None)
print("SENT=" + json.dumps({"value": value, "status": status, "jm": jm}))
"""


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Started processes, each stopped by its PID at the end (SIGTERM, then SIGKILL)."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in reversed(started):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in reversed(started):
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def test_a_fresh_project_runs_a_task_on_its_own_broker_and_job_manager(
    installed_wheel: InstalledWheel, tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    site = make_site(installed_wheel, tmp_path)
    frontend, backend, monitor = free_tcp_ports(3)
    env = {
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "EMQ_FRONTEND_BIND": f"tcp://127.0.0.1:{frontend}",
        "EMQ_BROKER_URL": f"tcp://127.0.0.1:{frontend}",
        "EMQ_BACKEND_BIND": f"tcp://127.0.0.1:{backend}",
        "EMQ_WORKER_URL": f"tcp://127.0.0.1:{backend}",
        "EMQ_MONITOR_BIND": f"tcp://127.0.0.1:{monitor}",
        "EMQ_MONITOR_URL": f"tcp://127.0.0.1:{monitor}",
    }
    installed_wheel.run("python", "manage.py", "migrate", "-v", "0", cwd=site, env=env)
    full_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    full_env.pop("DJANGO_SETTINGS_MODULE", None)
    full_env.update(env, PYTHONUNBUFFERED="1")
    python = installed_wheel.python
    for name, args in (
        ("broker", ["emq_broker"]),
        ("jobmanager", ["emq_jobmanager", "--queues", "default:10", "--concurrency", "1"]),
    ):
        with (tmp_path / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(
                [python, "manage.py", *args],
                cwd=site,
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        processes.append(proc)
        if name == "broker":
            deadline = time.monotonic() + 20
            while not port_accepts(frontend) and proc.poll() is None:
                assert time.monotonic() < deadline, (tmp_path / "broker.log").read_text()
                time.sleep(0.1)

    sent = installed_wheel.run("python", "manage.py", "shell", "-c", SEND, cwd=site, env=env)
    logs = "".join(
        f"--- {n}.log\n{(tmp_path / f'{n}.log').read_text()}" for n in ("broker", "jobmanager")
    )
    line = next((x for x in sent.stdout.splitlines() if x.startswith("SENT=")), None)
    if line is None:
        pytest.fail(f"no outcome printed\n{sent.stdout}\n{sent.stderr}\n{logs}")
    outcome = json.loads(line.removeprefix("SENT="))
    if outcome != {"value": 5, "status": "succeeded", "jm": outcome["jm"]} or not outcome["jm"]:
        pytest.fail(f"{outcome}\n{logs}")
    # the journal went where the docs say: BASE_DIR/var, not the current directory
    assert (site / "var" / "emq-journal.sqlite3").exists(), sorted(p.name for p in site.iterdir())
    assert all(p.poll() is None for p in processes), logs
