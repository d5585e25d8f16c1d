"""Installed as a wheel, the example project's admin pages all render (issue 12,
item 8: the analytics dashboard's template was left out of the package)."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest

from tests.packaging.conftest import InstalledWheel
from tests.support import REPO_ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]


def test_wheel_carries_every_apps_templates_static_and_migrations(
    installed_wheel: InstalledWheel,
) -> None:
    names = set(zipfile.ZipFile(installed_wheel.wheel).namelist())
    for source in (REPO_ROOT / "emq_django").rglob("*"):
        relative = source.relative_to(REPO_ROOT).as_posix()
        if source.is_file() and any(
            part in ("templates", "static", "migrations") for part in source.parts
        ):
            if "__pycache__" not in relative and not relative.endswith(".pyc"):
                assert relative in names, f"{relative} is not in the wheel"


def test_every_admin_page_of_the_example_project_renders_from_the_wheel(
    installed_wheel: InstalledWheel, tmp_path: Path
) -> None:
    site = tmp_path / "site"  # the example project, outside the source tree
    shutil.copytree(
        REPO_ROOT / "project", site / "project", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copytree(REPO_ROOT / "templates", site / "templates")
    shutil.copy2(Path(__file__).with_name("render_admin.py"), site / "render_admin.py")
    done = installed_wheel.run(
        "python",
        "render_admin.py",
        cwd=site,
        env={
            "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
            "EMQ_DASHBOARD_TIMEOUT": "0.2",
        },
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"emq_django from {installed_wheel.venv}" in done.stdout
    assert "200 /admin/emq_analytics/metricsdashboard/" in done.stdout
