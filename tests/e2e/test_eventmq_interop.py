"""Interop with the released EventMQ 0.3.13 peers, over real loopback TCP.

- EventMQ's client (``Sender`` + ``defer_job``) -> our broker -> our job manager:
  registered ``@emq.task`` functions run, anything else is refused and counted failed.
- Our client (``task.delay()``) -> our broker -> EventMQ's ``emq-jobmanager``: the job
  runs and ``.get()`` returns the value from EventMQ's ``{"value": ...}`` REPLY.
- EventMQ's ``schedule()`` frames (SCHEDULE, cron SCHEDULE, UNSCHEDULE) are ACKed by
  our broker, held while no scheduler is connected, and forwarded unchanged to the
  first scheduler that INFORMs.

See docs/eventmq-wire.md for what those peers send. Every process is started through
the ``emq_processes`` fixture and stopped by PID in teardown.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from django.test import override_settings

from emq_django import monitor_client
from emq_django.client import reset_client
from tests.e2e import interop_tasks
from tests.support import REPO_ROOT, EmqProcesses, ManagedProcess, start_broker, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.interop, pytest.mark.timeout(60)]

eventmq = pytest.importorskip("eventmq", reason="make test installs eventmq==0.3.13")

TASKS_MODULE = interop_tasks.__name__  # "tests.e2e.interop_tasks"
PROTOCOL = b"eMQP/1.0"


# ---- helpers -----------------------------------------------------------------------


def status(env: dict[str, str]) -> dict[str, Any]:
    return monitor_client.status(env["EMQ_MONITOR_URL"])


def counters(env: dict[str, str]) -> dict[str, int]:
    return status(env)["counters"]


def free_slots(env: dict[str, str], queue: str = "default") -> int:
    for q in status(env)["queues"]:
        if q["name"] == queue:
            return sum(jm["free_slots"] for jm in q["job_managers"])
    return 0


def marker_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def start_our_jobmanager(procs: EmqProcesses, env: dict[str, str], marker: Path) -> ManagedProcess:
    jm = procs.start(
        "emq_jobmanager",
        "--queues",
        "default:10",
        "--concurrency",
        "2",
        name="jobmanager",
        env={"EMQ_IMPORTS": TASKS_MODULE, interop_tasks.MARKER_ENV: str(marker)},
    )
    procs.wait_for_output(jm, f"{TASKS_MODULE}.record")  # "registered tasks: ..."
    # Both worker processes have connected and given their credit.
    wait_until(
        lambda: free_slots(env) >= 2,
        "our job manager's 2 slots on queue default",
        timeout=15,
        procs=procs,
    )
    return jm


def eventmq_jobmanager_path() -> Path:
    path = Path(sys.executable).parent / "emq-jobmanager"
    if not path.exists():
        pytest.skip(f"{path} is missing: run `make venv` (pip install --no-deps eventmq==0.3.13)")
    return path


def start_eventmq_jobmanager(
    procs: EmqProcesses, env: dict[str, str], marker: Path, *args: str
) -> ManagedProcess:
    """EventMQ's own job manager (2 workers on queue default), once both its slots
    are free at the broker; ``args``: more of its options (``--name``)."""
    jm = procs.start_program(
        [str(eventmq_jobmanager_path()), "--broker-addr", env["EMQ_WORKER_URL"], *args],
        name="eventmq-jobmanager",
        env={
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])
            ),
            "EVENTMQ_CONFIG_FILE": "/nonexistent",
            "EVENTMQ_QUEUES": '[[10, "default"]]',
            "EVENTMQ_CONCURRENT_JOBS": "2",
            interop_tasks.MARKER_ENV: str(marker),
        },
    )

    def ready() -> bool:  # (only this process: one stopped before may be in ``procs``)
        assert jm.alive(), f"EventMQ's job manager exited:\n{jm.log_tail()}"
        return free_slots(env) >= 2

    # INFORM -> our ACK + HEARTBEAT -> it forks its 2 workers -> one READY each.
    wait_until(ready, "EventMQ's job manager to report 2 free slots", timeout=15)
    return jm


class EventMQClient:
    """EventMQ's own client socket (``eventmq.sender.Sender``), plus reading what our
    broker sends back to it (EventMQ's client never reads; the test does)."""

    def __init__(self, url: str) -> None:
        from eventmq.sender import Sender

        self.sender = Sender()
        self.sender.connect(url)
        self.received: list[list[bytes]] = []

    @property
    def socket(self) -> zmq.Socket[Any]:
        return self.sender.zsocket

    def defer_job(self, func: str, **kwargs: Any) -> str:
        from eventmq.client.messages import defer_job

        msgid = defer_job(self.sender, func, **kwargs)
        assert msgid, f"EventMQ's defer_job refused to send {func!r}"
        return str(msgid)

    def schedule(self, func: str, **kwargs: Any) -> str:
        from eventmq.client.messages import schedule

        msgid = schedule(self.sender, func, **kwargs)
        assert msgid, f"EventMQ's schedule refused to send {func!r}"
        return str(msgid)

    def _pump(self, timeout: float) -> None:
        if self.socket.poll(int(timeout * 1000)):
            while self.socket.poll(0):
                self.received.append(self.socket.recv_multipart())

    def wait_for(
        self, what: str, match: Callable[[list[bytes]], bool], timeout: float = 10.0
    ) -> list[bytes]:
        deadline = time.monotonic() + timeout
        while True:
            for frames in self.received:
                if match(frames):
                    return frames
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {what} within {timeout} s; got {self.received!r}")
            self._pump(min(remaining, 0.2))

    def wait_ack(self, msgid: str, timeout: float = 5.0) -> list[bytes]:
        frames = self.wait_for(
            f"ACK of {msgid}",
            lambda f: len(f) >= 3 and f[2] == b"ACK" and f[-1] == msgid.encode(),
            timeout,
        )
        assert frames[:2] == [b"", PROTOCOL]
        assert len(frames) == 5, f"ACK must be ['', 'eMQP/1.0', 'ACK', newid, msgid]: {frames}"
        return frames

    def wait_reply(self, msgid: str, timeout: float = 10.0) -> list[bytes]:
        return self.wait_for(
            f"REPLY to {msgid}",
            lambda f: len(f) >= 5 and f[2] == b"REPLY" and msgid.encode() in f[4:],
            timeout,
        )

    def close(self) -> None:
        self.socket.close(linger=0)


@pytest.fixture
def eventmq_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep EventMQ's settings loader in this process off /etc/eventmq.conf."""
    monkeypatch.setenv("EVENTMQ_CONFIG_FILE", "/nonexistent")


@pytest.fixture
def eventmq_client(emq_env: dict[str, str], eventmq_env: None) -> Iterator[EventMQClient]:
    client = EventMQClient(emq_env["EMQ_BROKER_URL"])
    yield client
    client.close()


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "ran.txt"


@pytest.fixture
def our_client(emq_env: dict[str, str]) -> Iterator[None]:
    """This process's emq client talks to the test's broker."""
    reset_client()
    with override_settings(
        EMQ_BROKER_URL=emq_env["EMQ_BROKER_URL"], EMQ_EAGER=False, EMQ_ACK_TIMEOUT=5.0
    ):
        yield
        reset_client()


# ---- 1. EventMQ client -> our broker -> our job manager: registered tasks run -------


def test_eventmq_client_runs_registered_task_on_our_jobmanager(
    emq_processes: EmqProcesses,
    emq_env: dict[str, str],
    eventmq_client: EventMQClient,
    marker: Path,
) -> None:
    start_broker(emq_processes, emq_env)
    start_our_jobmanager(emq_processes, emq_env, marker)

    # Fire and forget, as EventMQ users do: no reply requested.
    first = eventmq_client.defer_job(f"{TASKS_MODULE}.record", args=["from-eventmq"])
    eventmq_client.wait_ack(first)
    wait_until(
        lambda: any(line.startswith("record from-eventmq ") for line in marker_lines(marker)),
        "the task's side effect",
        procs=emq_processes,
    )

    # kwargs, and reply-requested: our broker sends the result back to the client.
    second = eventmq_client.defer_job(
        f"{TASKS_MODULE}.add", kwargs={"x": 2, "y": 3}, reply_requested=True
    )
    eventmq_client.wait_ack(second)
    reply = eventmq_client.wait_reply(second)
    assert json.loads(reply[4]) == {"value": 5}
    assert "add 2 3" in marker_lines(marker)

    c = wait_until(
        lambda: (c := counters(emq_env))["succeeded"] >= 2 and c, "2 jobs counted as succeeded"
    )
    assert c["succeeded"] == 2
    assert c["failed"] == 0
    assert c["received"] == 2
    assert c["protocol_errors"] == 0
    assert len([line for line in marker_lines(marker) if line.startswith("record ")]) == 1


# ---- 2. ... and anything that is not a registered task is refused --------------------


def test_eventmq_client_cannot_run_unregistered_callables(
    emq_processes: EmqProcesses,
    emq_env: dict[str, str],
    eventmq_client: EventMQClient,
    marker: Path,
    tmp_path: Path,
) -> None:
    start_broker(emq_processes, emq_env)
    jm = start_our_jobmanager(emq_processes, emq_env, marker)
    pwned = tmp_path / "pwned"

    # EventMQ's own job manager would import `os` and call system(); ours must not.
    system = eventmq_client.defer_job("os.system", args=[f"touch {pwned}"], reply_requested=True)
    # Importable, in the very module EMQ_IMPORTS names, but not an @emq.task.
    plain = eventmq_client.defer_job(
        f"{TASKS_MODULE}.unregistered", args=["nope"], reply_requested=True
    )
    # The class form EventMQ supports: `module:Class` + method name.
    method = eventmq_client.defer_job("pathlib:Path.cwd", reply_requested=True)
    for msgid in (system, plain, method):
        eventmq_client.wait_ack(msgid)

    for msgid in (system, plain, method):
        body = json.loads(eventmq_client.wait_reply(msgid)[4])
        assert "value" not in body, f"an unregistered callable ran: {body}"
        assert body["error"]["type"] == "emq_django.exceptions.TaskNotFound", body

    c = wait_until(
        lambda: (c := counters(emq_env))["failed"] >= 3 and c,
        "3 jobs counted as failed",
        procs=emq_processes,
    )
    assert c["failed"] == 3
    assert c["succeeded"] == 0
    assert c["protocol_errors"] == 0

    # A registered task still runs afterwards: the refusals did not break the slots.
    ok = eventmq_client.defer_job(f"{TASKS_MODULE}.record", args=["still-works"])
    eventmq_client.wait_ack(ok)
    wait_until(
        lambda: any(line.startswith("record still-works ") for line in marker_lines(marker)),
        "the registered task after the refusals",
        procs=emq_processes,
    )
    wait_until(lambda: counters(emq_env)["succeeded"] == 1, "it counted as succeeded")

    assert not pwned.exists(), "os.system ran: the job manager executed an unregistered callable"
    assert not any(line.startswith("unregistered") for line in marker_lines(marker))
    log = jm.stderr()
    for name in ("os.system", f"{TASKS_MODULE}.unregistered", "pathlib:Path.cwd"):
        assert f"{name} is not a registered task" in log, f"no refusal logged for {name}"
    assert log.count("refused job") >= 3


def test_eventmq_client_retry_count_out_of_range_is_refused_with_the_reason(
    emq_processes: EmqProcesses, emq_env: dict[str, str], eventmq_client: EventMQClient
) -> None:
    """A retry-count the worker's slot table cannot hold (2^31) used to crash-loop
    the worker processes, uncounted, for ever (issue 29, item 1): the broker
    answers it with an ERROR and the reason instead."""
    start_broker(emq_processes, emq_env)
    msgid = eventmq_client.defer_job(
        f"{TASKS_MODULE}.record", args=["poison"], retry_count=2**31, guarantee=True
    )
    frames = eventmq_client.wait_for(
        f"ERROR for {msgid}",
        lambda f: len(f) >= 7 and f[2] == b"ERROR" and f[4] == msgid.encode(),
    )
    assert frames[5] == b"bad-header", frames
    assert b"retry-count" in frames[6] and b"2147483647" in frames[6], frames
    c = counters(emq_env)
    assert c["refused_bad_header"] == 1
    ok = eventmq_client.defer_job(f"{TASKS_MODULE}.record", args=["fine"], retry_count=2**31 - 1)
    eventmq_client.wait_ack(ok)


# ---- 3. our client -> our broker -> EventMQ's job manager ----------------------------


@pytest.mark.parametrize(
    "heartbeat_interval", ["0.5", "1.0"], ids=["heartbeat-0.5s", "heartbeat-default-1s"]
)
def test_our_client_runs_jobs_on_eventmq_jobmanager(
    emq_processes: EmqProcesses,
    emq_env: dict[str, str],
    our_client: None,
    marker: Path,
    heartbeat_interval: str,
) -> None:
    # EMQ_HEARTBEAT_INTERVAL is the broker's own beat; EventMQ's job manager beats every
    # 3 s whatever the broker does, and the broker must keep it all the same.
    start_broker(emq_processes, emq_env, extra_env={"EMQ_HEARTBEAT_INTERVAL": heartbeat_interval})
    jm = start_eventmq_jobmanager(emq_processes, emq_env, marker)
    managers = status(emq_env)["job_managers"]
    assert [m["kind"] for m in managers] == ["eventmq"], managers

    assert interop_tasks.add.delay(2, 3).get(timeout=10) == 5
    assert interop_tasks.record.delay("via-eventmq").get(timeout=10) == "via-eventmq"
    lines = marker_lines(marker)
    assert "add 2 3" in lines
    assert any(line.startswith("record via-eventmq ") for line in lines), lines

    # EventMQ's job manager heartbeats only every 3 s: an idle spell longer than that
    # (and than our own heartbeat liveness) must not lose it.
    time.sleep(4.0)
    assert interop_tasks.add.delay(20, 22).get(timeout=10) == 42

    c = counters(emq_env)
    assert c["succeeded"] == 3
    assert c["failed"] == 0
    assert c["protocol_errors"] == 0
    assert c["peers_expired"] == 0
    managers = status(emq_env)["job_managers"]
    assert len(managers) == 1, f"EventMQ's job manager reconnected: {managers}"
    assert jm.alive()
    # its figures (issue 35's job manager page): no memory report, "not reported"
    (entry,) = managers
    assert (entry["jobs_done"], entry["jobs_failed"], entry["memory_bytes"]) == (3, 0, None)


# ---- 4. EventMQ's schedule() frames: ACKed, held, forwarded unchanged ----------------
# The scheduler itself is a later issue; the broker must already accept these frames,
# ACK them, hold them while no scheduler is connected and hand them over unchanged.


def test_trace_and_status_name_an_eventmq_job_manager_alike(
    emq_processes: EmqProcesses,
    emq_env: dict[str, str],
    our_client: None,
    marker: Path,
    tmp_path: Path,
) -> None:
    """An identity that starts with a digit (EventMQ's are uuid4 strings) was hex in
    the trace and text in emq_status (issue 29, item 18)."""
    trace_dir = tmp_path / "trace"
    start_broker(emq_processes, emq_env, extra_env={"EMQ_TRACE_DIR": str(trace_dir)})
    # its identity is a fresh uuid4 (its --name is not used): started again until
    # one starts with a digit (10 in 16 do)
    for _ in range(20):
        jm = start_eventmq_jobmanager(emq_processes, emq_env, marker)
        (manager,) = status(emq_env)["job_managers"]
        name = manager["identity"]
        if name[0].isdigit():
            break
        emq_processes.stop(jm)
        wait_until(lambda: not status(emq_env)["job_managers"], "the job manager gone")
    assert name[0].isdigit() and "-" in name, name
    result = interop_tasks.add.delay(1, 2)
    assert result.get(timeout=10) == 3

    def names_in_trace() -> set[str]:
        names = set()
        for path in trace_dir.glob("trace-*.jsonl"):
            for line in path.read_text().splitlines():
                event = json.loads(line)
                if event["job"] == result.id and event.get("jm"):
                    names.add(event["jm"])
        return names

    assert wait_until(names_in_trace, "the trace to name the job manager") == {name}


def run_body(func_args: list[Any]) -> bytes:
    """The body EventMQ's client sends for `record(*func_args)` (docs/eventmq-wire.md 1.3)."""
    return json.dumps(
        [
            "run",
            {
                "callable": "record",
                "path": TASKS_MODULE,
                "args": func_args,
                "kwargs": {},
                "class_args": [],
                "class_kwargs": {},
            },
        ]
    ).encode()


def connect_fake_scheduler(url: str, expect: int, timeout: float = 10.0) -> list[list[bytes]]:
    """INFORM as a scheduler on the client port, as EventMQ's scheduler does; return the
    SCHEDULE/UNSCHEDULE frames received until `expect` of them came (or time ran out)."""
    sched: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    sched.linger = 0
    sched.setsockopt_string(zmq.IDENTITY, str(uuid.uuid4()))
    try:
        sched.connect(url)
        inform_id = str(uuid.uuid4()).encode()
        sched.send_multipart([b"", PROTOCOL, b"INFORM", inform_id, b"", b"scheduler"])
        got: list[list[bytes]] = []
        forwarded: list[list[bytes]] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(forwarded) < expect:
            if sched.poll(100):
                frames = sched.recv_multipart()
                got.append(frames)
                if frames[2:3] in ([b"SCHEDULE"], [b"UNSCHEDULE"]):
                    forwarded.append(frames)
        assert got and got[0][2] == b"ACK" and got[0][4] == inform_id, got
        return forwarded
    finally:
        sched.close(linger=0)


def test_eventmq_schedule_frames_are_acked_held_and_forwarded(
    emq_processes: EmqProcesses,
    emq_env: dict[str, str],
    eventmq_client: EventMQClient,
) -> None:
    start_broker(emq_processes, emq_env)
    func = f"{TASKS_MODULE}.record"

    interval = eventmq_client.schedule(func, interval_secs=60, args=["every-minute"])
    cron = eventmq_client.schedule(func, cron="*/5 * * * *", args=["cron"], headers=("nohaste",))
    for msgid in (interval, cron):
        eventmq_client.wait_ack(msgid)

    c = counters(emq_env)
    assert c["protocol_errors"] == 0
    assert c["acked"] == 2
    assert c["received"] == 0, "a SCHEDULE is not a job to run now"

    # The 9 frames EventMQ's client sent, byte for byte, client msgid kept.
    assert connect_fake_scheduler(emq_env["EMQ_BROKER_URL"], expect=2) == [
        [
            b"",
            PROTOCOL,
            b"SCHEDULE",
            interval.encode(),
            b"default",
            b"guarantee",
            b"60",
            run_body(["every-minute"]),
            b"",
        ],
        [
            b"",
            PROTOCOL,
            b"SCHEDULE",
            cron.encode(),
            b"default",
            b"nohaste",
            b"-1",
            run_body(["cron"]),
            b"*/5 * * * *",
        ],
    ]
    assert counters(emq_env)["protocol_errors"] == 0


def test_eventmq_unschedule_frames_are_acked_and_forwarded(
    emq_processes: EmqProcesses,
    emq_env: dict[str, str],
    eventmq_client: EventMQClient,
) -> None:
    """EventMQ users unschedule with `messages.schedule(sock, ..., unschedule=True)`
    (`jobs.unschedule` always raises). With neither interval nor cron given, that
    sends interval `-1` and an empty cron frame: valid for UNSCHEDULE, which names the
    job by its body only."""
    start_broker(emq_processes, emq_env)
    func = f"{TASKS_MODULE}.record"

    unschedule = eventmq_client.schedule(func, args=["every-minute"], unschedule=True)
    # With an interval too, as `jobs.unschedule` would have sent it.
    with_interval = eventmq_client.schedule(
        func, interval_secs=60, args=["every-minute"], unschedule=True
    )
    for msgid in (unschedule, with_interval):
        eventmq_client.wait_ack(msgid)
    assert counters(emq_env)["protocol_errors"] == 0

    assert connect_fake_scheduler(emq_env["EMQ_BROKER_URL"], expect=2) == [
        [
            b"",
            PROTOCOL,
            b"UNSCHEDULE",
            unschedule.encode(),
            b"default",
            b"guarantee",
            b"-1",
            run_body(["every-minute"]),
            b"",
        ],
        [
            b"",
            PROTOCOL,
            b"UNSCHEDULE",
            with_interval.encode(),
            b"default",
            b"guarantee",
            b"60",
            run_body(["every-minute"]),
            b"",
        ],
    ]
    assert counters(emq_env)["protocol_errors"] == 0
