"""Across machines, on one machine: the broker, a job manager and a client each in
its own network namespace, joined by veth pairs, sniffed on the broker's side.

    client 10.231.2.2 =veth= 10.231.2.1 broker 10.231.1.1 =veth= 10.231.1.2 job manager

The broker binds its frontend to the client-side veth address and its backend to
the job-manager side (its monitor stays on the namespace's loopback); nothing is
reachable from the machine's own namespace. A raw AF_PACKET socket in the broker's
namespace (tests/e2e/netns_sniffer.py) records every frame on both of its veths.

- plain text (``EMQ_ALLOW_PLAINTEXT=true``, the control): jobs flow, and the
  sniffer sees each job's argument: it proves the sniffer sees the jobs' traffic;
- CURVE (added with the CURVE transport): jobs flow, no argument is seen in clear
  text, and a job manager holding a client key gets nothing.

Needs root and iproute2's ``ip``; skipped, saying which, without them. The
namespaces are named ``emqt-<pid>-{b,w,c}`` and always deleted, with the
processes stopped by PID first.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from emq_django.link import REFUSED_EXIT
from tests.support import REPO_ROOT, EmqProcesses, ManagedProcess
from tests.support.netns import ip, why_not

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

BROKER_W, WORKER = "10.231.1.1", "10.231.1.2"  # the broker / job manager link
BROKER_C, CLIENT = "10.231.2.1", "10.231.2.2"  # the broker / client link
BROKER_IFACES = ("vb-w", "vb-c")  # the broker's ends
JOBS = 5


@dataclass(frozen=True)
class Net:
    broker: str  # namespace names
    worker: str
    client: str

    def run_in(self, ns: str) -> list[str]:
        return ["ip", "netns", "exec", ns]


def _ip(*args: str) -> None:
    ip(*args)


def _build(net: Net) -> None:
    for ns in (net.broker, net.worker, net.client):
        _ip("netns", "add", ns)
        _ip("-n", ns, "link", "set", "lo", "up")
    for ours, theirs, ns, here, there in (
        ("vb-w", "vw", net.worker, BROKER_W, WORKER),
        ("vb-c", "vc", net.client, BROKER_C, CLIENT),
    ):
        _ip("link", "add", ours, "netns", net.broker, "type", "veth", "peer", theirs, "netns", ns)
        _ip("-n", net.broker, "addr", "add", f"{here}/24", "dev", ours)
        _ip("-n", ns, "addr", "add", f"{there}/24", "dev", theirs)
        _ip("-n", net.broker, "link", "set", ours, "up")
        _ip("-n", ns, "link", "set", theirs, "up")


def _delete_orphans() -> None:
    """Namespaces of an earlier run that was killed before its teardown (their pid
    is gone): a run that is alive keeps its own."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    for line in listed.stdout.splitlines():
        found = re.fullmatch(r"emqt-(\d+)-[bwc]", line.split(" ")[0])
        if found and not Path(f"/proc/{found.group(1)}").exists():
            subprocess.run(["ip", "netns", "del", found.group(0)], capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    reason = why_not()
    if reason:
        pytest.skip(reason)
    _delete_orphans()
    pid = os.getpid()
    net = Net(f"emqt-{pid}-b", f"emqt-{pid}-w", f"emqt-{pid}-c")
    try:
        _build(net)
        yield net
    finally:
        for ns in (net.broker, net.worker, net.client):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def test_the_namespaces_reach_each_other_only_through_the_broker(net: Net) -> None:
    def connect_errno(ns: str, address: str) -> int:
        probe = f"import socket; print(socket.socket().connect_ex(({address!r}, 9)))"
        argv = [*net.run_in(ns), sys.executable, "-c", probe]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        return int(done.stdout.strip())

    # a refused connection (nothing listens on port 9) proves the address is reached
    assert connect_errno(net.worker, BROKER_W) == errno.ECONNREFUSED
    assert connect_errno(net.client, BROKER_C) == errno.ECONNREFUSED
    assert connect_errno(net.client, WORKER) == errno.ENETUNREACH  # no route between them
    assert connect_errno(net.client, "127.0.0.1") == errno.ECONNREFUSED  # its own loopback


# ---- one stack: sniffer, broker, job manager, client ----------------------------------


@dataclass
class Stack:
    net: Net
    procs: EmqProcesses
    tmp: Path
    keys: Keys
    frontend: int
    backend: int

    def base_env(self) -> dict[str, str]:
        """Plain text: the CURVE settings of the test process are not passed on."""
        return {
            "EMQ_CURVE_SECRET_KEY": "",
            "EMQ_CURVE_SERVER_KEY": "",
            "DJANGO_SETTINGS_MODULE": "project.settings",
            "DATABASE_URL": self.keys.database_url,
            "PYTHONPATH": str(REPO_ROOT),
            "EMQ_HEARTBEAT_INTERVAL": "0.5",
        }

    def sniff(self) -> tuple[ManagedProcess, Path]:
        capture = self.tmp / "capture.bin"
        argv = [*self.net.run_in(self.net.broker), sys.executable]
        argv += [str(REPO_ROOT / "tests/e2e/netns_sniffer.py"), str(capture), *BROKER_IFACES]
        sniffer = self.procs.start_program(argv, name="sniffer")
        self.procs.wait_for_output(sniffer, "ready", timeout=30, stream="stdout")
        return sniffer, capture

    def broker(self, env: dict[str, str]) -> ManagedProcess:
        monitor = free_port_anywhere()
        env = {
            **self.base_env(),
            "EMQ_FRONTEND_BIND": f"tcp://{BROKER_C}:{self.frontend}",
            "EMQ_BACKEND_BIND": f"tcp://{BROKER_W}:{self.backend}",
            "EMQ_MONITOR_BIND": f"tcp://127.0.0.1:{monitor}",
            "EMQ_MDP_BIND": "",
            "EMQ_PZQ_RECEIVE_BIND": "",
            "EMQ_JOURNAL_PATH": str(self.tmp / "journal.sqlite3"),
            **env,
        }
        argv = [*self.net.run_in(self.net.broker), *manage("emq_broker")]
        broker = self.procs.start_program(argv, env=env, name="broker")
        self.procs.wait_for_output(broker, "broker up", timeout=60)
        return broker

    def jobmanager(self, env: dict[str, str], name: str = "jobmanager") -> ManagedProcess:
        env = {
            **self.base_env(),
            "EMQ_WORKER_URL": f"tcp://{BROKER_W}:{self.backend}",
            "EMQ_IMPORTS": "tests.e2e.netns_tasks",
            "NETNS_JM_NAME": name,
            **env,
        }
        argv = [*self.net.run_in(self.net.worker), *manage("emq_jobmanager")]
        argv += ["--queues", "netns:10", "--concurrency", "1"]
        return self.procs.start_program(argv, env=env, name=name)

    def client(self, env: dict[str, str], secret: str) -> ManagedProcess:
        env = {**self.base_env(), "EMQ_BROKER_URL": f"tcp://{BROKER_C}:{self.frontend}", **env}
        argv = [*self.net.run_in(self.net.client), sys.executable]
        argv += [str(REPO_ROOT / "tests/e2e/netns_client.py"), secret, str(JOBS)]
        return self.procs.start_program(argv, env=env, name="client")


def manage(command: str) -> list[str]:
    return [sys.executable, str(REPO_ROOT / "manage.py"), command]


def free_port_anywhere() -> int:
    """A port number for an address in another namespace: any will do there, as
    nothing else listens in it; taken from the kernel's free ones for variety."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Keys:
    """The module's database (migrated, the keys registered) and key files."""

    database_url: str
    dir: Path

    def env(self, name: str) -> dict[str, str]:
        """The CURVE settings of the process holding key ``name``."""
        return {
            "EMQ_CURVE_SECRET_KEY": str(self.dir / f"{name}.key_secret"),
            "EMQ_CURVE_SERVER_KEY": str(self.dir / "broker.key"),
        }


@pytest.fixture(scope="module")
def keys(net: Net, tmp_path_factory: pytest.TempPathFactory) -> Keys:
    """One database for the module's brokers: migrated, with the job manager's and
    the client's public keys registered (``manage.py emq_keys generate``)."""
    tmp = tmp_path_factory.mktemp("netns-keys")
    keys = Keys(f"sqlite:///{tmp / 'db.sqlite3'}", tmp / "keys")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMQ_")}
    env.update(DJANGO_SETTINGS_MODULE="project.settings", DATABASE_URL=keys.database_url)
    for args in (
        ["migrate", "--noinput"],
        ["emq_keys", "generate", "broker", "--server", "--dir", str(keys.dir)],
        ["emq_keys", "generate", "jobmanager", "--roles", "worker", "--dir", str(keys.dir)],
        ["emq_keys", "generate", "client", "--roles", "client", "--dir", str(keys.dir)],
    ):
        done = subprocess.run(
            manage(args[0]) + args[1:], cwd=REPO_ROOT, env=env, capture_output=True, timeout=300
        )
        assert done.returncode == 0, done.stderr.decode(errors="replace")
    return keys


@pytest.fixture
def stack(net: Net, keys: Keys, tmp_path: Path) -> Iterator[Stack]:
    with EmqProcesses(tmp_path / "logs") as procs:
        yield Stack(net, procs, tmp_path, keys, free_port_anywhere(), free_port_anywhere())


def secret_marker() -> str:
    return "SECRET-" + os.urandom(8).hex()


def wait_for_results(stack: Stack, client: ManagedProcess, secret: str) -> list[dict[str, str]]:
    code = stack.procs.wait_for_exit(client, timeout=120)
    assert code == 0, client.log_tail()
    results = json.loads(client.stdout().strip().splitlines()[-1])
    expected = [hashlib.sha256(f"{secret}-{n}".encode()).hexdigest() for n in range(JOBS)]
    assert [r["sha256"] for r in results] == expected
    return results


def stop_sniffer(stack: Stack, sniffer: ManagedProcess, capture: Path) -> list[bytes]:
    """The frames the sniffer recorded, once it has stopped."""
    stack.procs.stop(sniffer)
    raw = capture.read_bytes()
    frames, at = [], 0
    while at + 4 <= len(raw):
        (size,) = struct.unpack_from(">I", raw, at)
        frames.append(raw[at + 4 : at + 4 + size])
        at += 4 + size
    return frames


def tcp_payloads(frames: list[bytes], port: int) -> bytes:
    """The TCP payload bytes of IPv4 frames from or to ``port``, concatenated."""
    out = []
    for frame in frames:
        if len(frame) < 34 or frame[12:14] != b"\x08\x00" or frame[23] != 6:
            continue  # not Ethernet + IPv4 + TCP
        ihl = (frame[14] & 0x0F) * 4
        tcp = frame[14 + ihl :]
        src, dst = struct.unpack_from(">HH", tcp)
        if port in (src, dst):
            out.append(tcp[(tcp[12] >> 4) * 4 :])
    return b"".join(out)


# ---- plain text: the control ----------------------------------------------------------


def test_plaintext_control_jobs_flow_and_the_sniffer_sees_the_arguments(stack: Stack) -> None:
    plain = {"EMQ_ALLOW_PLAINTEXT": "true"}
    sniffer, capture = stack.sniff()
    stack.broker(plain)
    stack.jobmanager(plain)
    secret = secret_marker()
    client = stack.client(plain, secret)
    assert {r["jm"] for r in wait_for_results(stack, client, secret)} == {"jobmanager"}
    frames = stop_sniffer(stack, sniffer, capture)
    to_clients = tcp_payloads(frames, stack.frontend)
    to_workers = tcp_payloads(frames, stack.backend)
    for n in range(JOBS):
        argument = f"{secret}-{n}".encode()
        assert argument in to_clients  # the client's REQUEST
        assert argument in to_workers  # the broker's REQUEST to the job manager


def test_without_allow_plaintext_the_broker_refuses_its_veth_addresses(stack: Stack) -> None:
    argv = [*stack.net.run_in(stack.net.broker), *manage("emq_broker")]
    env = {
        **stack.base_env(),
        "EMQ_FRONTEND_BIND": f"tcp://{BROKER_C}:{stack.frontend}",
        "EMQ_BACKEND_BIND": f"tcp://{BROKER_W}:{stack.backend}",
        "EMQ_MDP_BIND": "",
        "EMQ_PZQ_RECEIVE_BIND": "",
        "EMQ_JOURNAL_PATH": str(stack.tmp / "journal.sqlite3"),
    }
    broker = stack.procs.start_program(argv, env=env, name="broker")
    assert stack.procs.wait_for_exit(broker, timeout=60) != 0
    assert f"tcp://{BROKER_C}:{stack.frontend}" in broker.stderr()
    assert "refusing to bind a non-loopback address without CURVE" in broker.stderr()


# ---- CURVE ----------------------------------------------------------------------------


def test_curve_jobs_flow_and_no_argument_crosses_in_clear_text(stack: Stack) -> None:
    sniffer, capture = stack.sniff()
    broker = stack.broker(stack.keys.env("broker"))
    assert "CURVE on every port" in broker.stderr()
    stack.jobmanager(stack.keys.env("jobmanager"))
    secret = secret_marker()
    client = stack.client(stack.keys.env("client"), secret)
    assert {r["jm"] for r in wait_for_results(stack, client, secret)} == {"jobmanager"}
    frames = stop_sniffer(stack, sniffer, capture)
    to_clients = tcp_payloads(frames, stack.frontend)
    to_workers = tcp_payloads(frames, stack.backend)
    # the jobs' traffic was seen: each argument went both ways, encrypted
    assert len(to_clients) > JOBS * len(secret) and len(to_workers) > JOBS * len(secret)
    everything = b"".join(frames)
    assert secret.encode() not in everything
    assert secret.encode().hex().encode() not in everything


def test_curve_a_job_manager_with_a_client_key_is_refused_and_gets_no_job(stack: Stack) -> None:
    broker = stack.broker(stack.keys.env("broker"))
    secret = secret_marker()
    client = stack.client(stack.keys.env("client"), secret)  # its jobs wait for a worker
    rogue = stack.jobmanager(stack.keys.env("client"), name="rogue")  # a client's key
    refusal = f"(client, roles client) from {WORKER} on the port for worker"
    stack.procs.wait_for_output(broker, refusal, timeout=60)
    # told why at the handshake, the rogue says so and stops (the bound only ends a hang)
    assert rogue.popen.wait(timeout=60) == REFUSED_EXIT, rogue.log_tail()
    assert "ZAP: 400" in rogue.stderr()
    time.sleep(2)  # the jobs wait: had the rogue been let in, it would have run them
    assert client.alive()  # no result yet: nobody ran them
    stack.jobmanager(stack.keys.env("jobmanager"))
    assert {r["jm"] for r in wait_for_results(stack, client, secret)} == {"jobmanager"}
