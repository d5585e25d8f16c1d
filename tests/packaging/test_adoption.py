"""README, "Use it in your project", followed in a fresh project installed from the
wheel: `check` passes, and names the missing pieces when they are missing;
`migrate` runs; the README's pytest example runs a task under EMQ_EAGER."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.packaging.conftest import InstalledWheel

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

FENCE = re.compile(r"^```[a-z]*\n(.*?)^```\n", re.S | re.M)


def readme_files() -> dict[str, str]:
    """The section's code blocks that start with `# <relative path>`: path -> text."""
    readme = (REPO_ROOT / "README.md").read_text()
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


def test_a_fresh_project_follows_the_readme_checks_migrates_and_runs_a_task(
    installed_wheel: InstalledWheel, tmp_path: Path
) -> None:
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
    assert "1 passed" in tests.stdout, tests.stdout
