"""``manage.py check`` names the app a configured feature needs (emq_django/checks.py):
E004 for ``@emq.periodic`` without the scheduler app, and E002/E003 reported (not a
crash) when the results app is gone but its URL include is kept.

Each case is a ``manage.py check`` subprocess of the example project with a settings
module (and a tasks app) written to a temporary directory: INSTALLED_APPS and the
URLconf are read once per process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import REPO_ROOT

PERIODIC_TASKS = """
import emq_django as emq


@emq.periodic(every=60)
@emq.task(queue="default")
def nightly_cleanup():
    return 0
"""


def check(tmp_path: Path, settings: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "check_settings.py").write_text(
        "from project.settings import *  # noqa\n" + settings
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMQ_")}
    env.update(PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO_ROOT}", PYTHONUNBUFFERED="1")
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "manage.py"), "check", "--settings", "check_settings"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_periodic_without_scheduler_app_is_e004(tmp_path: Path) -> None:
    app = tmp_path / "periodicapp"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "tasks.py").write_text(PERIODIC_TASKS)
    done = check(
        tmp_path,
        "INSTALLED_APPS = [a for a in INSTALLED_APPS if a != 'emq_django.scheduler']\n"
        "INSTALLED_APPS += ['periodicapp']\n",
    )
    report = done.stdout + done.stderr
    assert done.returncode != 0, report
    assert "emq.E004" in report and "'emq_django.scheduler' is not in INSTALLED_APPS" in report
    assert "@emq.periodic" in report and "Traceback" not in report, report


def test_periodic_with_scheduler_app_passes(tmp_path: Path) -> None:
    app = tmp_path / "periodicapp"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "tasks.py").write_text(PERIODIC_TASKS)
    done = check(tmp_path, "INSTALLED_APPS += ['periodicapp']\n")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "E004" not in done.stdout + done.stderr


def test_results_app_missing_with_its_url_include_kept_is_reported_not_a_crash(
    tmp_path: Path,
) -> None:
    # project/urls.py keeps path("emq/", include("emq_django.results.urls"))
    done = check(
        tmp_path,
        "INSTALLED_APPS = [a for a in INSTALLED_APPS"
        " if a not in ('emq_django', 'emq_django.results')]\n"
        "EMQ_RECORDER = 'emq_django.results.recorder.DatabaseRecorder'\n",
    )
    report = done.stdout + done.stderr
    assert done.returncode != 0, report
    assert "Traceback" not in report and "RuntimeError" not in report, report
    assert "emq.E003" in report and "'emq_django.results' is not in INSTALLED_APPS" in report
    assert "emq.E002" in report, report


def test_a_plaintext_non_loopback_bind_is_w002_and_allow_plaintext_clears_it(
    tmp_path: Path,
) -> None:
    exposed = "EMQ_FRONTEND_BIND = 'tcp://0.0.0.0:47291'\n"
    done = check(tmp_path, exposed)
    report = done.stdout + done.stderr
    assert done.returncode == 0, report  # a warning: migrate and the job manager still run
    assert "emq.W002" in report and "EMQ_FRONTEND_BIND tcp://0.0.0.0:47291" in report
    allowed = check(tmp_path, exposed + "EMQ_ALLOW_PLAINTEXT = True\n")
    assert "emq.W002" not in allowed.stdout + allowed.stderr
