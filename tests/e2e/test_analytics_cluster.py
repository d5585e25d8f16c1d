"""emq_analyze --master spark://...: a standalone Spark master and worker started
from the pyspark installation, on loopback, stopped by PID in teardown."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO_ROOT, EmqProcesses, free_tcp_port

pyspark = pytest.importorskip("pyspark")

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def spark_class(*args: str) -> list[str]:
    return [str(Path(pyspark.__file__).parent / "bin" / "spark-class"), *args]


@pytest.mark.timeout(600)
def test_emq_analyze_runs_on_a_standalone_cluster(
    emq_processes: EmqProcesses, emq_env: dict[str, str], tmp_path: Path
):
    port = free_tcp_port()
    spark_env = {
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_HOME": str(Path(pyspark.__file__).parent),
        "SPARK_WORKER_DIR": str(tmp_path / "work"),
        "PYSPARK_PYTHON": sys.executable,
    }
    master = emq_processes.start_program(
        spark_class(
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            "0",
        ),
        env=spark_env,
        name="spark-master",
    )
    emq_processes.wait_for_port(port, timeout=120, proc=master)
    url = f"spark://127.0.0.1:{port}"
    worker = emq_processes.start_program(
        spark_class(
            "org.apache.spark.deploy.worker.Worker",
            url,
            "--cores",
            "1",
            "--memory",
            "1g",
            "--webui-port",
            "0",
        ),
        env=spark_env,
        name="spark-worker",
    )
    emq_processes.wait_for_output(worker, "Successfully registered with master", timeout=120)

    env = {**os.environ, **emq_env, **spark_env}
    trace, out = tmp_path / "trace", tmp_path / "out"

    def manage(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(REPO_ROOT / "manage.py"), *args],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    assert manage("migrate", "--noinput", "-v0").returncode == 0
    synth = manage("emq_trace_synth", "--jobs", "3000", "--rate", "20", "--out", str(trace))
    assert synth.returncode == 0, synth.stderr
    run = manage(
        "emq_analyze",
        "--master",
        url,
        "--trace-dir",
        str(trace),
        "--output",
        str(out),
        "--conf",
        "spark.executor.memory=512m",
        "--conf",
        "spark.cores.max=1",
        "--conf",
        "spark.driver.host=127.0.0.1",
        "--conf",
        "spark.sql.shuffle.partitions=2",
    )
    assert run.returncode == 0, run.stderr[-4000:]
    assert "3000 jobs finished" in run.stdout, run.stdout
    # The job really ran on the cluster's executor, not in a local driver.
    assert "Asked to launch executor" in worker.stderr()
    db = sqlite3.connect(emq_env["DATABASE_URL"].removeprefix("sqlite:///"))
    try:
        (jobs,) = db.execute("select sum(jobs) from emq_analytics_queuemetric").fetchone()
        (jms,) = db.execute(
            "select count(distinct jm) from emq_analytics_jobmanagermetric"
        ).fetchone()
    finally:
        db.close()
    assert jobs == 3000 and jms >= 3
    assert any((out / "task_minute").glob("date=*/*.parquet"))
