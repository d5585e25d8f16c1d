"""Starting and stopping server processes, free ports, CPU accounting."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = os.path.join(REPO, ".venv", "bin", "python")
VENV_BIN = os.path.join(REPO, ".venv", "bin")


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    return free_ports(1)[0]


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback TCP ports that were free a moment ago (bound
    together, so that the system cannot hand out one of them twice)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


# The broker's other protocols' ports (on by default, on their standard ports): a
# benchmark's broker gets private ones, so that it neither collides with another
# broker on this machine (make demo, a test, a parallel run) nor turns them off.
PROTOCOL_BINDS = (
    "MDP_BIND",
    "PZQ_RECEIVE_BIND",
    "PZQ_SEND_BIND",
    "PZQ_MONITOR_BIND",
    "BUS_SNAPSHOT_BIND",
    "BUS_PUBLISH_BIND",
    "BUS_COLLECT_BIND",
    "MC0_BIND",
)


def private_protocol_ports(taken: tuple[int, ...] = ()) -> dict[str, str]:
    """``EMQ_*_BIND`` of every other protocol's port, each on a free loopback port,
    distinct from each other and from ``taken`` (the broker's own ports: ports found
    free one at a time can come back twice, and a broker then failed to bind)."""
    ports = [p for p in free_ports(len(PROTOCOL_BINDS) + len(taken)) if p not in taken]
    pairs = zip(PROTOCOL_BINDS, ports, strict=False)  # (more ports than names: fine)
    return {f"EMQ_{name}": f"tcp://127.0.0.1:{port}" for name, port in pairs}


def base_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


@dataclass
class Server:
    name: str
    role: str  # "broker" or "workers"
    popen: subprocess.Popen[bytes]
    log_path: str
    known_pids: set[int] = field(default_factory=set)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def remember_children(self) -> None:
        """Record the process tree now, so that stop() can reach orphans by PID."""
        self.known_pids.add(self.pid)
        try:
            for child in psutil.Process(self.pid).children(recursive=True):
                self.known_pids.add(child.pid)
        except psutil.Error:
            pass

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, n: int = 30) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return b"\n".join(f.read().splitlines()[-n:]).decode(errors="replace")
        except OSError:
            return ""


class ServerSet:
    """Every process started here is stopped by PID in stop_all()."""

    def __init__(self, log_dir: str) -> None:
        self.servers: list[Server] = []
        self.log_dir = log_dir
        os.makedirs(log_dir, exist_ok=True)

    def start(self, name: str, role: str, argv: list[str], env: dict[str, str]) -> Server:
        log_path = os.path.join(self.log_dir, f"{name}.log")
        log = open(log_path, "wb")
        popen = subprocess.Popen(
            argv,
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C reaches us only
        )
        log.close()
        server = Server(name, role, popen, log_path)
        self.servers.append(server)
        return server

    def stop_all(self, grace: float = 10.0) -> None:
        for server in reversed(self.servers):
            server.remember_children()
        for server in reversed(self.servers):
            _signal(server.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for server in reversed(self.servers):
            try:
                server.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(server.pid, signal.SIGKILL)
                server.popen.wait(timeout=5)
        # Children that outlived their parent (e.g. pool processes): by PID.
        leftovers = [pid for s in self.servers for pid in s.known_pids if _alive(pid)]
        for pid in leftovers:
            _signal(pid, signal.SIGTERM)
        time.sleep(0.5 if leftovers else 0)
        for pid in leftovers:
            if _alive(pid):
                _signal(pid, signal.SIGKILL)
        self.servers.clear()


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    try:
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def find_system_pids(name: str) -> list[int]:
    """PIDs of a system service (e.g. beam.smp for RabbitMQ), read only."""
    pids = []
    for p in psutil.process_iter(["name"]):
        if p.info["name"] == name:
            pids.append(p.pid)
    return pids


# ---------------------------------------------------------------- CPU accounting

Snapshot = dict[tuple[int, float], float]


def tree_cpu(root_pids: list[int]) -> Snapshot:
    """user+sys seconds of each process in the trees (own + reaped children)."""
    snap: Snapshot = {}
    for root in root_pids:
        try:
            procs = [psutil.Process(root)]
            procs += procs[0].children(recursive=True)
        except psutil.Error:
            continue
        for p in procs:
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    key = (p.pid, p.create_time())
                snap[key] = t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                continue
    return snap


def cpu_delta(before: Snapshot, after: Snapshot) -> float:
    """CPU seconds between two snapshots; processes that appeared count fully."""
    return sum(v - before.get(k, 0.0) for k, v in after.items())
