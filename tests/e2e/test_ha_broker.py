"""Active and standby brokers on one PostgreSQL journal (issue 32, section B): real
``manage.py emq_broker`` processes on different ports sharing a database of a
PostgreSQL cluster of the tests' own (tests/support/postgres.py).

- exactly one serves; the standby binds only its monitor, which says "standby" and
  names the active broker;
- kill -9 of the active: the standby takes the lease when it expires, restores the
  guaranteed job the killed one had acknowledged and serves it;
- SIGTERM of the active: it releases the lease, so the standby takes over at once
  (with a lease of 30 s, nothing but the release explains a take-over within 10 s);
- SIGSTOP of the active past its lease: the standby takes over; after SIGCONT the
  old one acknowledges nothing and goes back to standby by itself;
- PostgreSQL stopped under them: guaranteed jobs refused with the reason, plain
  ones served, and one active broker again once it is back;
- what ``emq_status`` and ``/emq/metrics`` show of it.

Clients here talk to one broker's address at a time (failover across a list of
addresses is the client's, tested elsewhere).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from emq_django.client import Client
from emq_django.exceptions import BrokerUnavailable, JobRefused
from emq_django.management.commands.emq_status import Command as StatusCommand
from emq_django.monitor_client import query, status
from emq_django.protocol.headers import format_headers
from emq_django.results.metrics import render
from tests.e2e.test_spine import IMPORTS
from tests.support import EmqProcesses, ManagedProcess, free_tcp_ports, wait_until
from tests.support.ports import port_accepts, port_of
from tests.support.postgres import PgCluster

pytestmark = pytest.mark.e2e

BODY = b'["run", {"path": "tests.e2e.spine_tasks", "callable": "add", "args": [1, 2]}]'
BINDS = (
    "FRONTEND",
    "BACKEND",
    "MONITOR",
    "MDP",
    "PZQ_RECEIVE",
    "PZQ_SEND",
    "PZQ_MONITOR",
    "MC0",
    "BUS_SNAPSHOT",
    "BUS_PUBLISH",
    "BUS_COLLECT",
)


def broker_env(pg_url: str, name: str, ttl: float) -> dict[str, str]:
    """One broker's environment: addresses of its own, the shared journal."""
    ports = free_tcp_ports(len(BINDS))
    env = {f"EMQ_{b}_BIND": f"tcp://127.0.0.1:{p}" for b, p in zip(BINDS, ports, strict=True)}
    return {
        **env,
        "EMQ_JOURNAL_URL": pg_url,
        "EMQ_JOURNAL_PATH": "",
        "EMQ_BROKER_NAME": name,
        "EMQ_LEASE_TTL": str(ttl),
        "EMQ_BROKER_URL": env["EMQ_FRONTEND_BIND"],
        "EMQ_WORKER_URL": env["EMQ_BACKEND_BIND"],
        "EMQ_MONITOR_URL": env["EMQ_MONITOR_BIND"],
    }


def ha(env: Mapping[str, str]) -> dict[str, Any] | None:
    """The broker's ``ha`` section, None while its monitor does not answer."""
    try:
        doc = status(env["EMQ_MONITOR_URL"], timeout=0.5)
    except BrokerUnavailable:
        return None
    return doc.get("ha")


def wait_role(
    env: Mapping[str, str], role: str, procs: list[ManagedProcess], timeout: float = 20.0
) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        state = ha(env)
        return state if state and state["role"] == role else None

    return wait_until(ready, f"{env['EMQ_BROKER_NAME']} {role}", timeout, procs)


class Pair:
    """Two brokers on one journal: ``b1`` started first (it becomes active)."""

    def __init__(self, procs: EmqProcesses, pg_url: str, ttl: float) -> None:
        self.procs = procs
        self.env1 = broker_env(pg_url, "b1", ttl)
        self.env2 = broker_env(pg_url, "b2", ttl)
        self.b1 = procs.start("emq_broker", name="b1", env=self.env1)
        wait_role(self.env1, "active", [self.b1])
        self.b2 = procs.start("emq_broker", name="b2", env=self.env2)
        state = wait_role(self.env2, "standby", [self.b1, self.b2])
        assert state["active"] == "b1"

    def send_guaranteed(self, env: Mapping[str, str], ack_timeout: float = 10.0) -> None:
        """One guaranteed job to ``env``'s broker; returns once it is acknowledged."""
        client = Client(env["EMQ_BROKER_URL"], ack_timeout=ack_timeout)
        try:
            client.send("spine", format_headers(guarantee=True), BODY, confirm=True)
            client.flush(timeout=ack_timeout)
        finally:
            client.close()


@pytest.fixture
def pair_procs(tmp_path: Any) -> Iterator[EmqProcesses]:
    with EmqProcesses(tmp_path / "logs", {"DJANGO_SETTINGS_MODULE": "project.settings"}) as p:
        yield p


def queue_depth(env: Mapping[str, str], queue: str) -> int:
    doc = status(env["EMQ_MONITOR_URL"], timeout=1.0)
    return sum(q["depth"] for q in doc["queues"] if q["name"] == queue)


def test_one_serves_and_the_standby_takes_over_after_kill_9(
    pair_procs: EmqProcesses, pg_url: str
) -> None:
    pair = Pair(pair_procs, pg_url, ttl=1.0)
    env1, env2 = pair.env1, pair.env2
    # the standby binds its monitor only, and sends other requests to the active one
    assert port_accepts(port_of(env1["EMQ_FRONTEND_BIND"]))
    assert not port_accepts(port_of(env2["EMQ_FRONTEND_BIND"]))
    answer = query(env2["EMQ_MONITOR_URL"], b"DEADLETTERS LIST", timeout=2.0)
    assert answer.startswith(b"ERROR standby") and b"b1" in answer, answer
    state = wait_until(lambda: (ha(env1) or {}).get("brokers", [None, None])[1:], "b2 listed")
    assert state and ha(env1)["brokers"][1]["role"] == "standby"  # type: ignore[index]

    pair.send_guaranteed(env1)  # acknowledged: in the journal before the ACK
    pair_procs.send_signal(pair.b1, signal.SIGKILL)
    killed = time.monotonic()
    state = wait_role(env2, "active", [pair.b2])
    active_after = time.monotonic() - killed
    wait_until(lambda: port_accepts(port_of(env2["EMQ_FRONTEND_BIND"])), "b2 serving")
    assert queue_depth(env2, "spine") == 1  # restored from the journal
    pair.send_guaranteed(env2)  # the new active acknowledges
    acked_after = time.monotonic() - killed
    assert state["epoch"] == 2

    # a job manager of the new active runs both
    jm_env = {"EMQ_IMPORTS": IMPORTS, "SPINE_JM_NAME": "jm", **env2}
    pair_procs.start("emq_jobmanager", "--queues", "spine:10", env=jm_env, name="jm")

    def succeeded() -> int:
        doc = status(env2["EMQ_MONITOR_URL"], timeout=1.0)
        return int(doc["counters"].get("succeeded", 0) >= 2)

    wait_until(succeeded, "both guaranteed jobs done on b2", 30)

    doc = status(env2["EMQ_MONITOR_URL"], timeout=1.0)
    failover = doc["ha"]["last_failover"]
    assert (failover["from"], failover["to"]) == ("b1", "b2") and failover["took_s"] is not None
    text = StatusCommand.render(doc)
    assert "High availability" in text and "this broker: b2 (active); active: b2" in text
    assert "last failover: b1 -> b2" in text
    metrics = render({"ok": True, "monitor": doc})
    assert 'emq_ha_active{broker="b2"} 1' in metrics and "emq_ha_epoch 2" in metrics
    assert "emq_ha_last_failover_seconds " in metrics
    print(
        f"\nkill -9 -> standby active: {active_after:.3f} s; -> first guaranteed ACK by it: "
        f"{acked_after:.3f} s; failover recorded (expiry -> serving): {failover['took_s']} s"
    )


def test_sigterm_releases_the_lease_so_the_standby_takes_over_at_once(
    pair_procs: EmqProcesses, pg_url: str
) -> None:
    pair = Pair(pair_procs, pg_url, ttl=30.0)  # expiry alone would take 30 s
    pair.send_guaranteed(pair.env1)
    stopped = time.monotonic()
    pair_procs.send_signal(pair.b1, signal.SIGTERM)
    assert pair_procs.wait_for_exit(pair.b1, timeout=10) == 0
    state = wait_role(pair.env2, "active", [pair.b2], timeout=10.0)
    took = time.monotonic() - stopped
    assert state["epoch"] == 2
    wait_until(lambda: port_accepts(port_of(pair.env2["EMQ_FRONTEND_BIND"])), "b2 serving")
    assert queue_depth(pair.env2, "spine") == 1
    assert "released the lease" in pair.b1.stderr()
    print(f"\nSIGTERM -> standby active: {took:.3f} s")


def test_a_paused_active_acknowledges_nothing_and_steps_down_by_itself(
    pair_procs: EmqProcesses, pg_url: str
) -> None:
    pair = Pair(pair_procs, pg_url, ttl=1.0)
    env1, env2 = pair.env1, pair.env2
    os.kill(pair.b1.pid, signal.SIGSTOP)
    try:
        wait_role(env2, "active", [pair.b2])
        outcome: list[BaseException | None] = []
        client = Client(env1["EMQ_BROKER_URL"], ack_timeout=4.0)

        def send() -> None:
            try:
                client.send("spine", format_headers(guarantee=True), BODY, confirm=True)
                outcome.append(None)
            except (BrokerUnavailable, JobRefused) as exc:
                outcome.append(exc)

        sender = threading.Thread(target=send)
        sender.start()
        wait_until(lambda: client._sock is not None, "the client's socket")
    finally:
        os.kill(pair.b1.pid, signal.SIGCONT)
    sender.join(timeout=15)
    client.close()
    assert outcome and outcome[0] is not None, "the paused broker acknowledged a job"
    state = wait_role(env1, "standby", [pair.b1, pair.b2])
    assert state["active"] == "b2"
    assert "steps down to standby" in pair.b1.stderr()
    assert (ha(env2) or {}).get("role") == "active"
    assert queue_depth(env2, "spine") == 0  # never journaled: never acknowledged


def test_postgresql_down_refuses_guaranteed_jobs_serves_plain_ones_and_recovers(
    pair_procs: EmqProcesses, pg_url: str, pg_cluster: PgCluster
) -> None:
    pair = Pair(pair_procs, pg_url, ttl=1.0)
    env1, env2 = pair.env1, pair.env2
    client = Client(env1["EMQ_BROKER_URL"], ack_timeout=5.0)
    try:
        client.send("spine", format_headers(), BODY)  # the socket is up before the outage
        client.flush(timeout=5.0)
        pg_cluster.stop("immediate")
        try:
            client.send("spine", format_headers(), BODY)  # plain jobs keep flowing
            client.flush(timeout=5.0)
            with pytest.raises(JobRefused) as refused:
                client.send("spine", format_headers(guarantee=True), BODY, confirm=True)
            assert "unreachable" in str(refused.value), refused.value
            state = wait_until(lambda: (ha(env1) or {}).get("error"), "b1 tells the outage")
            assert state and (ha(env1) or {}).get("role") == "active"
        finally:
            pg_cluster.start()
    finally:
        client.close()

    def settled() -> Mapping[str, str] | None:
        """One active broker, serving, that the other one names, both reaching
        PostgreSQL again."""
        states = [ha(env1), ha(env2)]
        if not all(states) or any(s["error"] for s in states):  # type: ignore[index]
            return None
        roles = sorted(s["role"] for s in states)  # type: ignore[index]
        if roles != ["active", "standby"] or states[0]["active"] != states[1]["active"]:  # type: ignore[index]
            return None
        env = env1 if states[0]["role"] == "active" else env2  # type: ignore[index]
        return env if port_accepts(port_of(env["EMQ_FRONTEND_BIND"])) else None

    env = wait_until(settled, "one active broker again", 30, [pair.b1, pair.b2])

    def accepted() -> bool:
        try:  # the journal's own connection may come back a moment after the lease's
            pair.send_guaranteed(env)
        except JobRefused:
            return False
        return True

    wait_until(accepted, "a guaranteed job journaled again", 15, [pair.b1, pair.b2])
    assert queue_depth(env, "spine") >= 1
