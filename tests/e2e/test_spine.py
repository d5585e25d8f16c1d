"""The spine, end to end: real `manage.py` processes talking over loopback.

broker + job managers (+ a `manage.py shell` or this process as the client).
The tasks are in tests/e2e/spine_tasks.py, which the job managers import through
EMQ_IMPORTS; each job manager gets SPINE_JM_NAME so that a result says where it ran.
Timings worth knowing are printed (run with -s to see them).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from emq_django.client import reset_client
from emq_django.conf import reset_cached_settings
from emq_django.exceptions import BrokerUnavailable, ResultTimeout, TaskFailed
from emq_django.monitor_client import status
from tests.e2e import spine_tasks as tasks
from tests.support import REPO_ROOT, EmqProcesses, ManagedProcess, start_broker, wait_until

pytestmark = pytest.mark.e2e

IMPORTS = "tests.e2e.spine_tasks"
TASKS_FILE = "spine_tasks.py"


# ---- helpers ----------------------------------------------------------------


def start_jm(
    procs: EmqProcesses,
    name: str,
    queues: str = "spine:10",
    concurrency: int = 2,
    extra_env: Mapping[str, str] | None = None,
) -> ManagedProcess:
    env = {"EMQ_IMPORTS": IMPORTS, "SPINE_JM_NAME": name, **(extra_env or {})}
    return procs.start(
        "emq_jobmanager",
        "--queues",
        queues,
        "--concurrency",
        str(concurrency),
        "--name",
        name,
        env=env,
        name=f"jm-{name}",
    )


def monitor(env: Mapping[str, str]) -> dict[str, Any]:
    return status(env["EMQ_MONITOR_URL"], timeout=1.0)


def job_manager(doc: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((m for m in doc["job_managers"] if m["identity"] == name), None)


def wait_jm_ready(
    env: Mapping[str, str],
    name: str,
    free_slots: int,
    procs: Sequence[ManagedProcess] = (),
    timeout: float = 15.0,
) -> dict[str, Any]:
    """Wait until MONITOR lists job manager `name` (its control connection, pid) with at
    least `free_slots` credits."""

    def ready() -> dict[str, Any] | None:
        try:
            entry = job_manager(monitor(env), name)
        except BrokerUnavailable:
            return None
        # the slots and the control connection INFORM separately: wait for both
        ok = entry and entry["free_slots"] >= free_slots and entry["pid"] is not None
        return entry if ok else None

    return wait_until(ready, f"job manager {name} with {free_slots} free slots", timeout, procs)


def wait_busy(
    env: Mapping[str, str], name: str, busy: int = 1, procs: Sequence[ManagedProcess] = ()
) -> None:
    wait_until(
        lambda: (job_manager(monitor(env), name) or {}).get("busy", 0) >= busy,
        f"job manager {name} to run {busy} job(s)",
        10.0,
        procs,
    )


def run_manage(
    env: Mapping[str, str],
    *args: str,
    extra_env: Mapping[str, str] | None = None,
    timeout: float = 30.0,
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **env, **(extra_env or {})}
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "manage.py"), *args],
        cwd=REPO_ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def tagged(stdout: str, tag: str) -> Any:
    """The JSON printed as ``TAG=<json>`` by a shell snippet."""
    for line in stdout.splitlines():
        if line.startswith(tag + "="):
            return json.loads(line[len(tag) + 1 :])
    raise AssertionError(f"no {tag}= line in the shell's stdout:\n{stdout}")


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` from /proc/<pid>/stat, in seconds."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of stat(5)
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie leader that is not reaped yet still counts: look for live members
    return any(_pgid_state(pid, pgid) for pid in os.listdir("/proc") if pid.isdigit())


def _pgid_state(pid: str, pgid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[2]) == pgid and fields[0] != "Z"


@pytest.fixture
def client(emq_client_env: dict[str, str]) -> dict[str, str]:
    """This process as a client of the test's broker (see conftest)."""
    return emq_client_env


# ---- 1. delay/get across processes, remote failures ---------------------------


SHELL_ROUND_TRIP = """
import json, os
from emq_django import TaskFailed
from tests.e2e import spine_tasks as t
print("SHELLPID=" + json.dumps(os.getpid()))
print("VALUE=" + json.dumps(t.whoami.delay("hello").get(timeout=15)))
print("SUM=" + json.dumps(t.add.delay(20, 22).get(timeout=15)))
try:
    t.boom.delay("kaput 42").get(timeout=15)
except TaskFailed as e:
    print("FAILED=" + json.dumps({"type": e.type, "message": e.message,
                                  "traceback": e.traceback, "str": str(e)}))
else:
    print("FAILED=null")
"""


def test_delay_from_shell_runs_on_job_manager(
    emq_processes: EmqProcesses, emq_env: dict[str, str]
) -> None:
    broker = start_broker(emq_processes, emq_env)
    jm = start_jm(emq_processes, "S", concurrency=2)
    wait_jm_ready(emq_env, "S", 2, [broker, jm])

    t0 = time.monotonic()
    out = run_manage(emq_env, "shell", "-c", SHELL_ROUND_TRIP)
    print(f"manage.py shell round trip (3 tasks) took {time.monotonic() - t0:.2f} s")
    assert out.returncode == 0, out.stderr

    shell_pid = tagged(out.stdout, "SHELLPID")
    value = tagged(out.stdout, "VALUE")
    assert value["tag"] == "hello"
    assert value["name"] == "S"
    assert value["pid"] != shell_pid
    assert value["ppid"] == jm.pid, "the task ran in a worker process of the job manager"
    assert tagged(out.stdout, "SUM") == 42

    failed = tagged(out.stdout, "FAILED")
    assert failed is not None, "boom() did not raise TaskFailed"
    assert failed["type"] == "ValueError"
    assert failed["message"] == "kaput 42"
    assert TASKS_FILE in failed["traceback"]
    assert "raise ValueError(message)" in failed["traceback"]
    assert "ValueError: kaput 42" in failed["str"]


# ---- 2. weights: the heavier job manager gets every job while it has slots ----


def test_weighted_job_managers(emq_processes: EmqProcesses, client: dict[str, str]) -> None:
    env = client
    prefetch = {"EMQ_PREFETCH": "1"}
    broker = start_broker(emq_processes, env)
    a = start_jm(emq_processes, "A", queues="q:40", concurrency=2, extra_env=prefetch)
    b = start_jm(emq_processes, "B", queues="q:10", concurrency=2, extra_env=prefetch)
    procs = [broker, a, b]
    wait_jm_ready(env, "A", 2, procs)
    wait_jm_ready(env, "B", 2, procs)
    doc = monitor(env)
    assert job_manager(doc, "A")["slots"] == 2
    assert job_manager(doc, "A")["free_slots"] == 2, "EMQ_PREFETCH=1: one credit per slot"

    # at most 2 at a time: A always has a free slot, so B gets nothing
    where: list[str] = []
    for round_ in range(3):
        results = [tasks.nap.apply_async((0.3, f"pair{round_}-{i}"), queue="q") for i in range(2)]
        where += [r.get(timeout=10)["name"] for r in results]
    assert where == ["A"] * 6, f"jobs sent 2 at a time ran on {where}"

    # 4 at once: A's 2 slots fill, the other 2 go to B
    results = [tasks.nap.apply_async((0.3, f"burst-{i}"), queue="q") for i in range(4)]
    values = [r.get(timeout=10) for r in results]
    counts = Counter(v["name"] for v in values)
    assert counts == {"A": 2, "B": 2}, f"4 jobs at once ran on {dict(counts)}"
    span = max(v["finished"] for v in values) - min(v["started"] for v in values)
    print(f"4 jobs of 0.3 s on A's and B's 4 slots took {span:.2f} s from first start to last end")


# ---- 3. kill -9 of a job manager mid-job ----------------------------------------


def test_killed_job_manager_job_runs_elsewhere(
    emq_processes: EmqProcesses, client: dict[str, str], tmp_path: Path
) -> None:
    env = client
    interval, liveness = 0.5, 3
    hb = {"EMQ_HEARTBEAT_INTERVAL": str(interval), "EMQ_HEARTBEAT_LIVENESS": str(liveness)}
    broker = start_broker(emq_processes, env, extra_env=hb)
    a = start_jm(emq_processes, "A", queues="spine:40", concurrency=2, extra_env=hb)
    b = start_jm(emq_processes, "B", queues="spine:10", concurrency=2, extra_env=hb)
    procs = [broker, a, b]
    wait_jm_ready(env, "A", 2, procs)
    wait_jm_ready(env, "B", 2, procs)

    done = tmp_path / "done"
    # a retry left: the attempt killed with A counts (issue 12), the next runs on B;
    # with retries=0 and no guarantee it would run at most once
    result = tasks.nap.apply_async((5.0, "victim", str(done)), retries=1)
    wait_busy(env, "A", 1, procs)
    assert job_manager(monitor(env), "B")["busy"] == 0, "the job should have gone to A (w40)"

    killed_at = time.monotonic()
    os.kill(a.pid, signal.SIGKILL)
    assert a.popen.wait(timeout=5) == -signal.SIGKILL

    def gone() -> bool:
        return job_manager(monitor(env), "A") is None

    limit = liveness * interval + 2.0
    wait_until(gone, "the broker to drop the killed job manager A", limit, [broker, b], 0.02)
    noticed = time.monotonic() - killed_at
    print(
        f"broker dropped the kill -9'd job manager after {noticed:.2f} s "
        f"(heartbeat {interval} s x liveness {liveness} = {interval * liveness} s)"
    )
    assert noticed < limit

    value = result.get(timeout=15)
    total = time.monotonic() - killed_at
    print(f"requeued job finished on {value['name']} {total:.2f} s after the kill")
    assert value["name"] == "B"
    assert value["tag"] == "victim"
    assert value["ppid"] == b.pid
    assert done.read_text().split()[1] == str(value["pid"])
    counters = monitor(env)["counters"]
    assert counters["worker_lost"] >= 1 and counters["retried"] >= 1  # counted (issue 12)


def test_frozen_job_manager_expires_after_liveness(
    emq_processes: EmqProcesses, client: dict[str, str]
) -> None:
    """kill -9 closes the TCP connections, so the broker may notice at its next send.
    A frozen job manager (SIGSTOP, connections open) is found only by missed heartbeats."""
    env = client
    interval, liveness = 0.5, 3
    hb = {"EMQ_HEARTBEAT_INTERVAL": str(interval), "EMQ_HEARTBEAT_LIVENESS": str(liveness)}
    broker = start_broker(emq_processes, env, extra_env=hb)
    a = start_jm(emq_processes, "A", queues="spine:40", concurrency=1, extra_env=hb)
    b = start_jm(emq_processes, "B", queues="spine:10", concurrency=1, extra_env=hb)
    procs = [broker, a, b]
    wait_jm_ready(env, "A", 1, procs)
    wait_jm_ready(env, "B", 1, procs)

    # a retry left: the frozen attempt counts (issue 12) and the next runs on B
    result = tasks.nap.apply_async((1.0, "frozen"), retries=1)
    wait_busy(env, "A", 1, procs)
    try:
        os.killpg(a.pid, signal.SIGSTOP)  # the job manager and its worker process
        frozen_at = time.monotonic()
        limit = liveness * interval + 2.0
        wait_until(
            lambda: job_manager(monitor(env), "A") is None,
            "the broker to drop the frozen job manager A",
            limit,
            [broker, b],
            0.02,
        )
        noticed = time.monotonic() - frozen_at
        print(
            f"broker dropped the SIGSTOPped job manager after {noticed:.2f} s "
            f"(heartbeat {interval} s x liveness {liveness} = {interval * liveness} s)"
        )
        assert noticed >= interval * (liveness - 1), "dropped before it missed its heartbeats"
        value = result.get(timeout=10)
        assert value["name"] == "B"
        assert value["tag"] == "frozen"
    finally:
        os.killpg(a.pid, signal.SIGKILL)


# ---- 4. the broker goes away and comes back ----------------------------------


def test_job_manager_reconnects_to_restarted_broker(
    emq_processes: EmqProcesses, client: dict[str, str]
) -> None:
    env = client
    broker = start_broker(emq_processes, env)
    jm = start_jm(emq_processes, "R", concurrency=1)
    wait_jm_ready(env, "R", 1, [broker, jm])
    assert tasks.add.delay(1, 2).get(timeout=10) == 3
    first_pid = monitor(env)["broker"]["pid"]

    stopped_at = time.monotonic()
    assert emq_processes.stop(broker) == 0, "the broker should exit 0 on SIGTERM"
    time.sleep(1.0)  # the job manager is alone for two heartbeat intervals
    assert jm.alive()

    broker2 = start_broker(emq_processes, env, name="broker-2")
    entry = wait_jm_ready(env, "R", 1, [broker2, jm])
    print(
        f"job manager back on the new broker {time.monotonic() - stopped_at:.2f} s after "
        "the old one stopped"
    )
    doc = monitor(env)
    assert doc["broker"]["pid"] == broker2.pid != first_pid
    assert entry["pid"] == jm.pid, "the same job manager process INFORMed the new broker"
    assert entry["slots"] == 1

    # the client in this process reconnects by itself as well
    value = tasks.whoami.delay("after restart").get(timeout=10)
    assert value["name"] == "R"
    assert value["tag"] == "after restart"
    assert jm.alive()


# ---- 5. SIGTERM: graceful, then immediate ------------------------------------


def test_first_sigterm_lets_the_job_finish(
    emq_processes: EmqProcesses, client: dict[str, str], tmp_path: Path
) -> None:
    env = client
    broker = start_broker(emq_processes, env)
    jm = start_jm(emq_processes, "G", concurrency=1)
    wait_jm_ready(env, "G", 1, [broker, jm])

    done = tmp_path / "done"
    result = tasks.nap.delay(2.0, "graceful", str(done))
    wait_busy(env, "G", 1, [broker, jm])
    signalled = time.monotonic()
    emq_processes.send_signal(jm, signal.SIGTERM)

    value = result.get(timeout=10)
    assert value["tag"] == "graceful"
    assert value["name"] == "G"
    assert done.exists()
    assert emq_processes.wait_for_exit(jm, timeout=10) == 0
    print(
        f"job manager exited 0 {time.monotonic() - signalled:.2f} s after SIGTERM "
        "(the job had ~2 s left)"
    )
    wait_until(
        lambda: job_manager(monitor(env), "G") is None,
        "MONITOR to stop listing job manager G",
        3.0,
        [broker],
    )
    assert not group_alive(jm.pid), "a worker process outlived its job manager"


def test_second_sigterm_stops_at_once(
    emq_processes: EmqProcesses, client: dict[str, str], tmp_path: Path
) -> None:
    env = client
    broker = start_broker(emq_processes, env)
    jm = start_jm(emq_processes, "H", concurrency=1)
    wait_jm_ready(env, "H", 1, [broker, jm])

    done = tmp_path / "done"
    result = tasks.nap.delay(15.0, "interrupted", str(done))
    wait_busy(env, "H", 1, [broker, jm])
    emq_processes.send_signal(jm, signal.SIGTERM)
    time.sleep(0.3)
    assert jm.alive(), "the first SIGTERM must not stop a job manager with a running job"
    signalled = time.monotonic()
    emq_processes.send_signal(jm, signal.SIGTERM)
    code = emq_processes.wait_for_exit(jm, timeout=5)
    took = time.monotonic() - signalled
    print(f"job manager exited with {code} {took:.2f} s after the second SIGTERM")
    assert took < 3.0
    wait_until(lambda: not group_alive(jm.pid), "the worker processes to be gone", 3.0)
    assert not done.exists(), "the job ran to its end although it was stopped"
    # What becomes of the killed job is a race in the product today (see the report
    # of this test's commit): the job manager answers for it with a WorkerLost
    # failure, or the broker sees the slot's connection gone first, requeues the job
    # and then drops that answer as stale. Either way it must not be lost silently.
    try:
        result.get(timeout=2)
    except TaskFailed as exc:
        assert exc.type == "emq_django.exceptions.WorkerLost", str(exc)
        print("the killed job came back as TaskFailed(WorkerLost)")
    except ResultTimeout:
        spine = next(q for q in monitor(env)["queues"] if q["name"] == "spine")
        assert spine["depth"] == 1, f"the killed job is neither answered nor requeued: {spine}"
        print("the killed job was requeued (no answer to the client)")
    else:
        raise AssertionError("the stopped job returned a value")


# ---- 6. no broker ------------------------------------------------------------


def test_broker_unavailable(client: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMQ_ACK_TIMEOUT", "1")
    reset_cached_settings()
    reset_client()
    url = client["EMQ_BROKER_URL"]  # a free port: nothing listens there
    t0 = time.monotonic()
    with pytest.raises(BrokerUnavailable) as info:
        tasks.add.delay(1, 2)
    took = time.monotonic() - t0
    print(f"BrokerUnavailable after {took:.2f} s: {info.value}")
    assert url in str(info.value)
    assert 0.9 <= took < 3.0


# ---- 7. EMQ_EAGER --------------------------------------------------------------


SHELL_EAGER = """
import json, os
from emq_django import TaskFailed
from tests.e2e import spine_tasks as t
print("SHELLPID=" + json.dumps(os.getpid()))
print("VALUE=" + json.dumps(t.whoami.delay("eager").get(timeout=1)))
print("SUM=" + json.dumps(t.add.delay(2, 3).get()))
try:
    t.boom.delay("eager boom").get()
except TaskFailed as e:
    print("FAILED=" + json.dumps({"type": e.type, "message": e.message,
                                  "traceback": e.traceback}))
else:
    print("FAILED=null")
"""


def test_eager_runs_in_process(emq_env: dict[str, str]) -> None:
    # no broker at all: EMQ_BROKER_URL points at a port nothing listens on
    out = run_manage(
        emq_env, "shell", "-c", SHELL_EAGER, extra_env={"EMQ_EAGER": "1", "EMQ_ACK_TIMEOUT": "1"}
    )
    assert out.returncode == 0, out.stderr
    shell_pid = tagged(out.stdout, "SHELLPID")
    value = tagged(out.stdout, "VALUE")
    assert value["tag"] == "eager"
    assert value["pid"] == shell_pid, "EMQ_EAGER runs the task in the caller's process"
    assert tagged(out.stdout, "SUM") == 5
    failed = tagged(out.stdout, "FAILED")
    assert failed is not None, "boom() did not raise TaskFailed under EMQ_EAGER"
    assert failed["message"] == "eager boom"
    assert TASKS_FILE in failed["traceback"]
    assert failed["type"].endswith("ValueError")


def test_eager_failure_type_matches_remote(emq_env: dict[str, str]) -> None:
    # Code that inspects TaskFailed.type must behave the same under EMQ_EAGER as
    # against a job manager, which reports "ValueError" (test 1).
    out = run_manage(emq_env, "shell", "-c", SHELL_EAGER, extra_env={"EMQ_EAGER": "1"})
    assert out.returncode == 0, out.stderr
    assert tagged(out.stdout, "FAILED")["type"] == "ValueError"


# ---- 8. emq_status ------------------------------------------------------------


def test_emq_status_tables(emq_processes: EmqProcesses, emq_env: dict[str, str]) -> None:
    broker = start_broker(emq_processes, emq_env)
    jm = start_jm(emq_processes, "status-jm", queues="spine:10,mailq:40", concurrency=2)
    wait_jm_ready(emq_env, "status-jm", 2, [broker, jm])

    out = run_manage(emq_env, "emq_status")
    print(out.stdout)
    assert out.returncode == 0, out.stderr
    assert "Queues" in out.stdout
    assert "Job managers" in out.stdout
    queues_part, _, managers_part = out.stdout.partition("Job managers")
    assert "spine" in queues_part and "mailq" in queues_part
    assert "status-jm" in managers_part
    assert str(jm.pid) in managers_part


# ---- 9. an idle broker sleeps --------------------------------------------------


def test_idle_broker_uses_no_cpu(emq_processes: EmqProcesses, emq_env: dict[str, str]) -> None:
    broker = start_broker(emq_processes, emq_env)
    jm = start_jm(emq_processes, "idle", concurrency=2)
    wait_jm_ready(emq_env, "idle", 2, [broker, jm])
    time.sleep(0.5)  # past start-up

    before_b, before_j = cpu_seconds(broker.pid), cpu_seconds(jm.pid)
    t0 = time.monotonic()
    time.sleep(3.0)
    used_b, used_j = cpu_seconds(broker.pid) - before_b, cpu_seconds(jm.pid) - before_j
    wall = time.monotonic() - t0
    print(
        f"over {wall:.2f} s idle: broker used {used_b:.3f} CPU-s, "
        f"job manager (control process) {used_j:.3f} CPU-s"
    )
    assert broker.alive() and jm.alive()
    assert job_manager(monitor(emq_env), "idle") is not None, "the job manager stayed connected"
    assert used_b < 0.3
