"""The package as users get it: a wheel built from the sources, installed in a fresh
venv (session-scoped, shared by the wheel and adoption tests).

Dependencies come from pip's configured index and caches (local wheels here, so it
stays offline and takes well under a minute). Commands run with a cwd outside the
source tree and without PYTHONPATH, so only the installed wheel can be imported.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import REPO_ROOT


@dataclass
class InstalledWheel:
    venv: Path
    wheel: Path

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    def run(
        self,
        *args: str,
        cwd: Path,
        env: Mapping[str, str] | None = None,
        timeout: float = 120,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run `args` (a venv program name or a path) in the venv; fails the test with
        the output when `check` and it exits non-zero."""
        program = args[0] if "/" in args[0] else str(self.venv / "bin" / args[0])
        full_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        full_env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{full_env.get('PATH', '')}"
        full_env.pop("DJANGO_SETTINGS_MODULE", None)
        full_env.update(env or {})
        done = subprocess.run(
            [program, *args[1:]],
            cwd=cwd,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and done.returncode != 0:
            pytest.fail(
                f"{' '.join(args)} exited with {done.returncode}\n"
                f"--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
            )
        return done


def _run(argv: list[str], cwd: Path) -> None:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}")


@pytest.fixture(scope="session")
def installed_wheel(tmp_path_factory: pytest.TempPathFactory) -> InstalledWheel:
    """emq-django's wheel with its [tasks] extra, pytest and pytest-django, in a new venv."""
    root = tmp_path_factory.mktemp("wheel")
    # Build from a copy of what the wheel is made of: no build/ or egg-info in the
    # source tree, nothing stale from an earlier build.
    src = root / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO_ROOT / name, src / name)
    shutil.copytree(
        REPO_ROOT / "emq_django",
        src / "emq_django",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    pip_env = [sys.executable, "-m", "pip"]
    _run([*pip_env, "wheel", "-q", "--no-deps", "-w", str(root / "dist"), str(src)], root)
    (wheel,) = (root / "dist").glob("emq_django-*.whl")
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], root)
    _run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            f"{wheel}[tasks]",
            "pytest",
            "pytest-django",
        ],
        root,
    )
    return InstalledWheel(venv, wheel)
