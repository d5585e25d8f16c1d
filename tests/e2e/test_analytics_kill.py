"""emq_analyze killed (SIGKILL, the Spark JVM and its Python workers with it) while
its final path's pass writes: the next run leaves nothing of it behind and gives
the tables and the admin's rows of a run that was never interrupted."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import REPO_ROOT

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def analyze(env: dict[str, str], trace: Path, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            str(REPO_ROOT / "manage.py"),
            "emq_analyze",
            "--master",
            "local[2]",
            "--trace-dir",
            str(trace),
            "--output",
            str(out),
        ],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: the JVM and workers die with it
    )


def finish(proc: subprocess.Popen[str], timeout: float = 300) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, out[-4000:]
    return out


def db_rows(url: str) -> dict[str, list[tuple]]:
    db = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        return {
            table: sorted(db.execute(f"select * from {table}").fetchall(), key=repr)
            for table in (
                "emq_analytics_queuemetric",
                "emq_analytics_taskmetric",
                "emq_analytics_jobmanagermetric",
                "emq_analytics_failuremetric",
            )
        }
    finally:
        db.close()


def strip_ids(rows: dict[str, list[tuple]]) -> dict[str, list[tuple]]:
    return {t: sorted((r[1:] for r in v), key=repr) for t, v in rows.items()}


@pytest.mark.timeout(900)
def test_a_run_killed_in_its_pass_is_redone_whole_by_the_next(
    emq_env: dict[str, str], tmp_path: Path
):
    env = {**os.environ, **emq_env, "SPARK_LOCAL_IP": "127.0.0.1"}
    manage = [sys.executable, str(REPO_ROOT / "manage.py")]
    trace = tmp_path / "trace"
    for args in (["migrate", "--noinput", "-v0"], ["emq_trace_synth", "--jobs", "200000"]):
        if args[0] == "emq_trace_synth":
            args += ["--rate", "200", "--out", str(trace)]
        done = subprocess.run([*manage, *args], cwd=REPO_ROOT, env=env, capture_output=True)
        assert done.returncode == 0, done.stderr[-2000:]

    # the run that is never interrupted
    clean = tmp_path / "clean"
    finish(analyze(env, trace, clean))
    want = strip_ids(db_rows(env["DATABASE_URL"]))
    assert want["emq_analytics_taskmetric"]

    # killed once the pass has written job files, before they are moved into jobs/
    out = tmp_path / "out"
    proc = analyze(env, trace, out)
    deadline = time.monotonic() + 240
    staging = out / "_staging"
    try:
        while not any(staging.glob("pass-*/jobs/date=*/*.parquet")):
            assert proc.poll() is None, "emq_analyze ended before its pass was caught"
            assert time.monotonic() < deadline, "no pass files within 240 s"
            time.sleep(0.005)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()  # reaps it and closes its pipe
    assert any(staging.iterdir()) and not (out / "jobs").exists()

    rerun = finish(analyze(env, trace, out))
    assert "200000 jobs finished" in rerun, rerun
    assert not staging.exists() or not any(staging.iterdir())
    assert strip_ids(db_rows(env["DATABASE_URL"])) == want
    jobs = sorted(p.name for p in (out / "jobs").rglob("*.parquet"))
    assert len(jobs) == len(list((clean / "jobs").rglob("*.parquet")))
    for table in ("task_minute", "queue_minute", "jm_minute", "failures", "slowest_tasks"):
        assert sorted(p.parent.name for p in (out / table).rglob("*.parquet")) == sorted(
            p.parent.name for p in (clean / table).rglob("*.parquet")
        )
