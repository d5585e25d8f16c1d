"""The set-up of tests/faults/test_ha.py: brokers on machines of their own (network
namespaces, tests/support/netns.py) sharing one PostgreSQL journal, job managers
and a load-generating client in the root namespace with every broker's address,
and what the scenarios read back: each broker's HA role from its monitor port,
the client's acknowledgements (tests/faults/ha_load.py) and the failover times.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emq_django.exceptions import EmqError
from emq_django.monitor_client import status
from tests.faults.history import History
from tests.support import REPO_ROOT, EmqProcesses, ManagedProcess, free_tcp_ports, wait_until
from tests.support.netns import Network

IMPORTS = "tests.faults.fault_tasks"
# A broker cannot take over before the lease of the one it replaces has run out
# (EMQ_LEASE_TTL, 1 s; renewed at most 0.2 s before a kill): an ACK read by the
# client this soon after a fault was sent by the old active, before the fault.
NO_TAKEOVER_BEFORE = 0.5  # seconds


@dataclass
class Load:
    """The load-generating client (ha_load.py) and what it wrote."""

    process: ManagedProcess
    dir: Path

    def _lines(self, name: str) -> list[dict[str, Any]]:
        path = self.dir / name
        if not path.exists():
            return []
        text = path.read_text()
        return [json.loads(x) for x in text.splitlines() if x.endswith("}")]

    def accepted(self) -> list[dict[str, Any]]:
        return self._lines("accepted.jsonl")

    def acks(self) -> list[dict[str, Any]]:
        """The acknowledged guaranteed sends (plain sends return unacknowledged)."""
        return [a for a in self.accepted() if a["kind"].startswith("g")]

    def errors(self) -> list[dict[str, Any]]:
        return self._lines("errors.jsonl")

    def results(self) -> list[dict[str, Any]]:
        return self._lines("results.jsonl")

    def wait_acks(self, more: int, timeout: float = 30.0) -> None:
        """Until ``more`` guaranteed jobs beyond those acknowledged now are."""
        target = len(self.acks()) + more
        wait_until(lambda: len(self.acks()) >= target, f"{more} more ACKs", timeout, [self.process])

    def first_ack_after(self, t: float, takeover: bool = True) -> float | None:
        """When the first guaranteed job acknowledged by the broker that took over
        after a fault at ``t`` was: the first ACK after ``t`` read on a connection
        to a new broker (the client's count of broker changes went up), or, if the
        client does not count them, the first ACK past NO_TAKEOVER_BEFORE. Without
        ``takeover``: the first ACK after ``t``, whoever sent it."""
        acks = self.acks()
        if not takeover:  # the same broker may answer: any ACK after t
            return next((float(a["t"]) for a in acks if a["t"] > t), None)
        before = [a["changes"] for a in acks if a["t"] <= t and a["changes"] is not None]
        after = [a for a in acks if a["t"] > t]
        if before:
            changed = [a["t"] for a in after if (a["changes"] or 0) > before[-1]]
            if changed:
                return float(changed[0])
        late = [a["t"] for a in after if a["t"] > t + NO_TAKEOVER_BEFORE]
        return float(late[0]) if late else None

    def stop(self, procs: EmqProcesses, timeout: float = 90.0) -> None:
        (self.dir / "stop").touch()
        code = procs.wait_for_exit(self.process, timeout=timeout)
        assert code == 0, self.process.log_tail()


@dataclass
class HaCluster:
    """Two (or more) brokers, one per machine of ``net``, on one journal URL."""

    net: Network
    procs: EmqProcesses
    tmp: Path
    journal_url: str
    history: History
    ports: list[int] = field(default_factory=lambda: free_tcp_ports(6))
    brokers: dict[int, ManagedProcess] = field(default_factory=dict)
    starts: int = 0

    # ---- addresses and environments -------------------------------------------------

    def _url(self, slot: int, i: int) -> str:
        return f"tcp://{self.net[i].address}:{self.ports[slot]}"

    def _urls(self, slot: int) -> str:
        return ",".join(self._url(slot, m.index) for m in self.net.machines)

    def monitor_url(self, i: int) -> str:
        return self._url(2, i)

    def env(self) -> dict[str, str]:
        """What every process of the test shares: clients and job managers know
        every broker (a comma-separated list)."""
        return {
            "DJANGO_SETTINGS_MODULE": "project.settings",
            "DATABASE_URL": f"sqlite:///{self.tmp / 'db.sqlite3'}",
            "PYTHONPATH": str(REPO_ROOT),
            "EMQ_CURVE_SECRET_KEY": "",
            "EMQ_CURVE_SERVER_KEY": "",
            "EMQ_ALLOW_PLAINTEXT": "true",
            "EMQ_IMPORTS": IMPORTS,
            "EMQ_FAULT_HISTORY": str(self.history.path),
            "EMQ_RETRY_BASE": "0.2",
            "EMQ_RETRY_CAP": "2",
            "EMQ_HEARTBEAT_INTERVAL": "0.5",
            "EMQ_BROKER_URL": self._urls(0),
            "EMQ_WORKER_URL": self._urls(1),
            "EMQ_MONITOR_URL": self._urls(2),
        }

    def broker_env(self, i: int) -> dict[str, str]:
        """Broker ``i`` binds its machine's address; the foreign protocols' ports
        are off (not under test here)."""
        return {
            **self.env(),
            "EMQ_FRONTEND_BIND": self._url(0, i),
            "EMQ_BACKEND_BIND": self._url(1, i),
            "EMQ_MONITOR_BIND": self._url(2, i),
            "EMQ_BUS_SNAPSHOT_BIND": self._url(3, i),
            "EMQ_BUS_PUBLISH_BIND": self._url(4, i),
            "EMQ_BUS_COLLECT_BIND": self._url(5, i),
            "EMQ_MDP_BIND": "",
            "EMQ_PZQ_RECEIVE_BIND": "",
            "EMQ_MC0_BIND": "",
            "EMQ_JOURNAL_URL": self.journal_url,
            "EMQ_JOURNAL_PATH": str(self.tmp / f"unused-journal-{i}.sqlite3"),
            "EMQ_BROKER_NAME": f"b{i}",
            "EMQ_TRACE_DIR": str(self.tmp / f"trace-{i}"),
            # set already: the broker does not re-execute itself to set it (a second
            # start-up of Django, seconds on a busy machine, in each of 20 restarts)
            "PYTHONMALLOC": "malloc",
        }

    # ---- brokers ------------------------------------------------------------------------

    def start(self, i: int) -> ManagedProcess:
        self.starts += 1
        argv = self.net[i].argv([sys.executable, str(REPO_ROOT / "manage.py"), "emq_broker"])
        broker = self.procs.start_program(argv, env=self.broker_env(i), name=f"b{i}-{self.starts}")
        self.brokers[i] = broker
        return broker

    def ha(self, i: int, timeout: float = 0.5) -> dict[str, Any] | None:
        """Broker ``i``'s MONITOR JSON "ha" section; None when it does not answer."""
        try:
            doc = status(self.monitor_url(i), timeout=timeout)
        except EmqError:
            return None
        ha = doc.get("ha")
        return ha if isinstance(ha, dict) else {"role": None, "doc_keys": sorted(doc)}

    def role(self, i: int) -> str | None:
        ha = self.ha(i)
        return None if ha is None else ha.get("role")

    def wait_role(self, i: int, role: str, timeout: float = 30.0) -> None:
        watched = [self.brokers[i]] if i in self.brokers else []
        wait_until(lambda: self.role(i) == role, f"b{i} to be {role}", timeout, watched)

    def start_pair(self) -> None:
        """Both brokers at once: one takes the lease, the other is its standby."""
        self.start(1)
        self.start(2)
        active = self.active(timeout=60)
        self.wait_role(self.other(active), "standby", 60)

    def active(self, timeout: float = 30.0) -> int:
        """The one broker that says it is active (waits for it)."""

        def one() -> int | None:
            actives = [m.index for m in self.net.machines if self.role(m.index) == "active"]
            return actives[0] if len(actives) == 1 else None

        # the brokers running now (not those killed before), as they start or take over
        found: int = wait_until(
            one, "exactly one active broker", timeout, list(self.brokers.values())
        )
        return found

    def other(self, i: int) -> int:
        return 2 if i == 1 else 1

    def kill(self, i: int) -> float:
        """SIGKILL broker ``i`` (its process, inside its machine); the time of it."""
        proc = self.brokers[i]
        t = time.time()
        os.kill(proc.pid, signal.SIGKILL)
        proc.popen.wait(timeout=10)
        return t

    def start_jobmanagers(self, count: int = 2) -> None:
        for n in range(count):
            self.procs.start(
                "emq_jobmanager",
                *("--queues", "faults:10", "--concurrency", "2", "--name", f"jm{n}"),
                env=self.env(),
                name=f"jm{n}",
            )

        def slots() -> bool:
            try:
                doc = status(self.monitor_url(self.active()), timeout=1.0)
            except EmqError:
                return False
            return sum(m["slots"] for m in doc["job_managers"]) >= 2 * count

        wait_until(slots, "the job managers' slots", 60, self.procs)

    def start_load(self, prefix: str) -> Load:
        out = self.tmp / f"load-{prefix}"
        out.mkdir()
        argv = [sys.executable, str(REPO_ROOT / "tests/faults/ha_load.py"), str(out), prefix]
        proc = self.procs.start_program(argv, env=self.env(), name=f"load-{prefix}")
        load = Load(proc, out)
        load.wait_acks(50, timeout=60)
        return load

    def logs(self, text: str) -> list[str]:
        """Lines of every broker's stderr containing ``text`` (case-insensitive)."""
        found = []
        for proc in self.procs.processes:
            if proc.name.startswith("b") and proc.stderr_path.exists():
                found += [
                    f"{proc.name}: {x}" for x in proc.stderr().splitlines() if text in x.lower()
                ]
        return found


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (p99 of 20 values is the largest)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]
