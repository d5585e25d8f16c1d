"""The Majordomo port end to end, with the released peer majortomo 0.2.0: its client
and its worker through our broker, both ways across to emq, the draft's framing,
a killed worker, and a flood of malformed messages."""

from __future__ import annotations

import json
import os
import random
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from tests.e2e import mdp_tasks
from tests.e2e.test_spine import monitor, wait_jm_ready
from tests.support import EmqProcesses, ManagedProcess, start_broker, wait_until
from tests.support.environ import environment

majortomo = pytest.importorskip("majortomo")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

C, W = b"MDPC02", b"MDPW02"


@pytest.fixture
def env(emq_env: dict[str, str], emq_client_env: dict[str, str]) -> Iterator[dict[str, str]]:
    extra = {"EMQ_IMPORTS": "tests.e2e.mdp_tasks"}
    with environment(emq_env, extra):
        yield emq_env


@pytest.fixture
def broker(emq_processes: EmqProcesses, env: dict[str, str]) -> ManagedProcess:
    proc = start_broker(emq_processes, env)
    emq_processes.wait_for_port(int(env["EMQ_MDP_BIND"].rsplit(":", 1)[1]), proc=proc)
    return proc


def mdp_url(env: dict[str, str]) -> str:
    return env["EMQ_MDP_BIND"]


def start_worker(
    procs: EmqProcesses, env: dict[str, str], service: str, mode: str, marker: str = ""
) -> ManagedProcess:
    argv = [sys.executable, "-m", "tests.e2e.mdp_worker", mdp_url(env), service, mode]
    if marker:
        argv.append(marker)
    return procs.start_program(argv, name=f"mdp-{service}-{mode}-{len(procs.processes)}")


def workers_of(env: dict[str, str], service: str) -> int:
    doc = monitor(env)
    queue = next((q for q in doc["queues"] if q["name"] == service), None)
    return 0 if queue is None else sum(e["free_slots"] for e in queue["job_managers"])


def wait_workers(env: dict[str, str], service: str, n: int = 1) -> None:
    wait_until(lambda: workers_of(env, service) >= n, f"{n} Majordomo worker(s) on {service}")


def client(env: dict[str, str]) -> Any:
    c = majortomo.Client(mdp_url(env))
    c.connect()
    return c


# ---- (a) majortomo's client to majortomo's worker, with partials ---------------------


def test_majortomo_client_to_majortomo_worker_with_partials(
    emq_processes: EmqProcesses, env: dict[str, str], broker: ManagedProcess
) -> None:
    start_worker(emq_processes, env, "parts", "partials")
    wait_workers(env, "parts")
    with client(env) as c:
        for _ in range(3):
            c.send(b"parts", b"hello")
            assert list(c.recv_all(timeout=10)) == [[b"p1"], [b"p2"], [b"done"]]
    doc = monitor(env)
    assert doc["counters"]["partials_forwarded"] == 6
    kinds = {m["kind"] for m in doc["job_managers"]}
    assert "majordomo" in kinds


# ---- (b) majortomo's client to an emq generator task ---------------------------------


def test_majortomo_client_to_an_emq_generator_task(
    emq_processes: EmqProcesses, env: dict[str, str], broker: ManagedProcess
) -> None:
    jm = emq_processes.start(
        "emq_jobmanager", "--queues", "mdp-gen:10", "--concurrency", "1", "--name", "gen"
    )
    wait_jm_ready(env, "gen", 1, [broker, jm])
    body = json.dumps(
        ["run", {"path": "tests.e2e.mdp_tasks", "callable": "countdown", "args": [3]}]
    ).encode()
    with client(env) as c:
        c.send(b"mdp-gen", body)
        parts = [json.loads(p[0]) for p in c.recv_all(timeout=15)]
    assert parts == [{"value": 3}, {"value": 2}, {"value": 1}, {"value": "liftoff"}]


# ---- (c) our .delay().stream() to majortomo's worker ---------------------------------


def test_our_stream_to_a_majortomo_worker(
    emq_processes: EmqProcesses, env: dict[str, str], broker: ManagedProcess
) -> None:
    start_worker(emq_processes, env, "mdp-json", "json")
    wait_workers(env, "mdp-json")
    handle = mdp_tasks.served_by_majordomo.delay(7)
    assert list(handle.stream(timeout=15)) == ["part-1", "part-2", 1]
    assert mdp_tasks.served_by_majordomo.delay(8).get(timeout=15) == 1


# ---- (d) the draft's framing: two requests outstanding from one client ---------------


def test_draft_client_with_two_outstanding_requests(
    emq_processes: EmqProcesses, env: dict[str, str], broker: ManagedProcess
) -> None:
    start_worker(emq_processes, env, "echo", "echo")
    start_worker(emq_processes, env, "echo", "echo")
    wait_workers(env, "echo", 2)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    try:
        sock.connect(mdp_url(env))
        sock.send_multipart([C, b"\x01", b"echo", b"req-1", b"first"])
        sock.send_multipart([C, b"\x01", b"echo", b"req-2", b"second", b"frame"])
        got = {}
        for _ in range(2):
            assert sock.poll(15_000), "no FINAL within 15 s"
            header, command, service, request_id, *body = sock.recv_multipart()
            assert (header, command, service) == (C, b"\x03", b"echo")
            got[request_id] = body
    finally:
        sock.close()
        ctx.destroy(linger=0)
    assert got == {b"req-1": [b"first"], b"req-2": [b"second", b"frame"]}


# ---- a killed worker's request is answered by another ---------------------------------


def test_a_killed_majordomo_workers_request_goes_to_another(
    emq_processes: EmqProcesses, env: dict[str, str], broker: ManagedProcess, tmp_path: Path
) -> None:
    marker = tmp_path / "got-it"
    slow = start_worker(emq_processes, env, "work", "slow", str(marker))
    wait_workers(env, "work")
    with client(env) as c:
        c.send(b"work", b"please")
        wait_until(marker.exists, "the slow worker got the request")
        os.kill(slow.pid, signal.SIGKILL)
        start_worker(emq_processes, env, "work", "echo")
        assert list(c.recv_all(timeout=30)) == [[b"please"]]
    counters = monitor(env)["counters"]
    assert counters["worker_lost"] + counters["peers_expired"] + counters["unroutable"] >= 1


# ---- 10,000 malformed messages ---------------------------------------------------------


def junk(rng: random.Random) -> list[bytes]:
    shapes = [
        lambda: [rng.randbytes(rng.randint(0, 12)) for _ in range(rng.randint(0, 6))],
        lambda: [b"", C, rng.choice([b"\x00", b"\x09", b"\x02"])],
        lambda: [b"", W, rng.choice([b"\x01", b"\x03", b"\x04", b"\x07"])],
        lambda: [W, rng.choice([b"PONG", b"\x04", b"\x01"]), b"x" * 300],
        lambda: [C, b"\x01", b"", b""],
        lambda: [b"", b"MDPX99", b"\x02", b"svc"],
    ]
    frames = rng.choice(shapes)()
    return frames or [b""]


def test_the_broker_survives_10000_malformed_messages_and_counts_them(
    emq_processes: EmqProcesses, env: dict[str, str], broker: ManagedProcess
) -> None:
    start_worker(emq_processes, env, "echo", "echo")
    wait_workers(env, "echo")
    before = monitor(env)["counters"]
    rng = random.Random(13)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.sndhwm = 0
    try:
        sock.connect(mdp_url(env))
        for _ in range(10_000):
            sock.send_multipart(junk(rng))
        # the socket stays open until the broker has counted them all (linger 0)
        counters = wait_until(
            lambda: (
                (c := monitor(env)["counters"])["protocol_errors"] - before["protocol_errors"]
                >= 10_000
                and c
            ),
            "the malformed messages counted",
            30,
        )
    finally:
        sock.close()
        ctx.destroy(linger=0)
    assert broker.alive()
    assert counters["internal_errors"] == 0
    with client(env) as c:  # and it still serves
        c.send(b"echo", b"still here")
        assert list(c.recv_all(timeout=10)) == [[b"still here"]]


# ---- refusals reach the client as a FINAL ----------------------------------------------


def test_a_refused_request_reaches_the_majortomo_client_as_a_final(
    emq_processes: EmqProcesses, env: dict[str, str], broker: ManagedProcess
) -> None:
    """Issue 29, item 15: a service name no queue can have (empty, not UTF-8, over
    255 bytes, with a space, ',' or ':', as the eMQP port refuses) is answered with
    a FINAL carrying the reason, so the released client is not left waiting; so is
    the draft's client, with its request id."""
    names = [b"", b"\xff\xfe", b"s" * 300, b"a b", b"a,b", b"a:b"]
    with client(env) as c:
        for name in names:
            c.send(name, b"body")
            (final,) = list(c.recv_all(timeout=10))
            error = json.loads(final[0])["error"]
            assert error["type"] == "emq_django.exceptions.JobRefused", error
            assert "service name" in error["message"], error
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    try:
        sock.connect(mdp_url(env))
        sock.send_multipart([C, b"\x01", b"a:b", b"req-9", b"body"])
        assert sock.poll(10_000), "no FINAL for the draft's request"
        header, command, service, request_id, body = sock.recv_multipart()
    finally:
        sock.close()
        ctx.destroy(linger=0)
    assert (header, command, service, request_id) == (C, b"\x03", b"a:b", b"req-9")
    assert "service name" in json.loads(body)["error"]["message"]
    counters = monitor(env)["counters"]
    assert counters["refused_bad_queue_name"] == 6 and counters["refused_queue_name_too_long"] == 1
    assert not [q for q in monitor(env)["queues"] if q["name"] in ("a b", "a,b", "a:b")]
