"""Foreign clients across a failover that moves the address (issue 32).

Other protocols' clients know one broker address. In production it is a virtual IP
that moves to the active broker (docs/high-availability.md); here each broker runs
in its own network namespace (tests/support/netns.py), and one address, the VIP,
moves from the first broker's machine to the second's after the first is killed
with SIGKILL. A real client of each protocol, connected to the VIP before the
failover, keeps working after it on the same socket or process:

- the released EventMQ 0.3.13 job manager (``emq-jobmanager``) runs our client's
  jobs again (it rejoins by itself once it misses the dead broker's heartbeats);
- the majortomo 0.2.0 worker answers a majortomo client again;
- a PZQ producer's message is confirmed and reaches the PZQ consumer;
- an Event BUS subscriber gets the next event, numbered on from the last one (the
  topic store is in the journal);
- an mc0 connector, after connecting again (as the released connector's watchdog
  does), gets a PUT on its topic.

Two variants of the failover: ``standby``, the active/standby broker
(``EMQ_JOURNAL_URL``): both brokers run at once on a PostgreSQL of the test's own,
listening on the bridge, and the standby takes the lease; ``handover``: the second
broker is started on the first one's SQLite journal file after the kill (one after
the other, never both at once; both machines see the same file system).

Needs root and iproute2's ``ip``, and the EventMQ and majortomo peers (``make
venv``); skipped, saying which, without them.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from django.test import override_settings

from emq_django import monitor_client
from emq_django.client import reset_client
from emq_django.exceptions import BrokerUnavailable
from tests import eventbus_client, mc0_client, pzq_client
from tests.e2e import interop_tasks
from tests.support import REPO_ROOT, EmqProcesses, ManagedProcess, wait_until
from tests.support.netns import Machine, Network, why_not

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(300)]

majortomo = pytest.importorskip("majortomo", reason="make venv installs majortomo==0.2.0")
pytest.importorskip("eventmq", reason="make venv installs eventmq==0.3.13")

# Every broker binds every port on all of its machine's addresses, so that it serves
# the VIP once the VIP is on its machine.
PORTS = {
    "EMQ_FRONTEND_BIND": 47291,
    "EMQ_BACKEND_BIND": 47290,
    "EMQ_MONITOR_BIND": 47293,
    "EMQ_MDP_BIND": 5555,
    "EMQ_PZQ_RECEIVE_BIND": 11131,
    "EMQ_PZQ_SEND_BIND": 11132,
    "EMQ_PZQ_MONITOR_BIND": 11133,
    "EMQ_BUS_SNAPSHOT_BIND": 5556,
    "EMQ_BUS_PUBLISH_BIND": 5557,
    "EMQ_BUS_COLLECT_BIND": 5558,
    "EMQ_MC0_BIND": 61616,
}
SERVICE = "ha-echo"  # the majortomo worker's service
# EventMQ's job manager misses 3 heartbeats of 5 s before it connects again (its
# conf.HEARTBEAT_TIMEOUT and HEARTBEAT_LIVENESS): that is its own timing, not ours.
EVENTMQ_REJOIN = 45.0


def url(address: str, setting: str) -> str:
    return f"tcp://{address}:{PORTS[setting]}"


class Brokers:
    """The brokers' machines, the VIP, and the failover."""

    def __init__(self, net: Network, procs: EmqProcesses, tmp: Path) -> None:
        self.net, self.procs, self.tmp = net, procs, tmp
        self.vip = net.address(100)
        self.active: tuple[Machine, ManagedProcess] | None = None

    def env(self) -> dict[str, str]:
        return {
            **{key: f"tcp://0.0.0.0:{port}" for key, port in PORTS.items()},
            "EMQ_ALLOW_PLAINTEXT": "true",  # a non-loopback bind without CURVE
            "DJANGO_SETTINGS_MODULE": "project.settings",
            "DATABASE_URL": f"sqlite:///{self.tmp / 'db.sqlite3'}",
            "PYTHONPATH": str(REPO_ROOT),
            "EMQ_HEARTBEAT_INTERVAL": "0.5",
            "EMQ_JOURNAL_PATH": str(self.tmp / "journal.sqlite3"),
            "EMQ_TRACE_DIR": "",
            "EMQ_CURVE_SECRET_KEY": "",
            "EMQ_CURVE_SERVER_KEY": "",
        }

    def start(self, machine: Machine) -> ManagedProcess:
        argv = machine.argv([sys.executable, str(REPO_ROOT / "manage.py"), "emq_broker"])
        broker = self.procs.start_program(argv, env=self.env(), name=f"broker-{machine.index}")
        self.procs.wait_for_output(broker, "broker up", timeout=60)
        return broker

    def first(self) -> None:
        """The first broker on machine 1, the VIP there."""
        machine = self.net[1]
        self.net.add_address(machine, self.vip)
        self.active = (machine, self.start(machine))
        self.wait_serving()

    def fail_over(self) -> None:
        """SIGKILL the active broker; the next one serves; the VIP moves to it."""
        assert self.active is not None
        old_machine, old = self.active
        self.procs.send_signal(old, signal.SIGKILL)
        self.procs.wait_for_exit(old, timeout=15)
        machine = self.net[2 if old_machine.index == 1 else 1]
        self.active = (machine, self.start(machine))
        self.net.move_address(self.vip, machine)
        self.wait_serving()

    def wait_serving(self) -> None:
        assert self.active is not None
        broker = self.active[1]
        for setting in ("EMQ_FRONTEND_BIND", "EMQ_BACKEND_BIND", "EMQ_MONITOR_BIND"):
            self.procs.wait_for_port(PORTS[setting], host=self.vip, timeout=30, proc=broker)

    def status(self) -> dict[str, Any]:
        return monitor_client.status(url(self.vip, "EMQ_MONITOR_BIND"))

    def free_slots(self, queue: str) -> int:
        try:
            queues = self.status()["queues"]
        except BrokerUnavailable:
            return 0
        for q in queues:
            if q["name"] == queue:
                return sum(jm["free_slots"] for jm in q["job_managers"])
        return 0


class StandbyBrokers(Brokers):
    """Both brokers running at once on one PostgreSQL journal (``EMQ_JOURNAL_URL``):
    the first is active, the second a standby that takes the lease when the first
    dies; the VIP follows the broker whose monitor says ``active``."""

    def __init__(self, net: Network, procs: EmqProcesses, tmp: Path, journal_url: str) -> None:
        super().__init__(net, procs, tmp)
        self.journal_url = journal_url
        self.processes: dict[int, ManagedProcess] = {}

    def env(self) -> dict[str, str]:
        env = super().env()
        del env["EMQ_JOURNAL_PATH"]
        return {**env, "EMQ_JOURNAL_URL": self.journal_url}

    def start(self, machine: Machine) -> ManagedProcess:
        argv = machine.argv([sys.executable, str(REPO_ROOT / "manage.py"), "emq_broker"])
        env = {**self.env(), "EMQ_BROKER_NAME": f"broker-{machine.index}"}
        broker = self.procs.start_program(argv, env=env, name=f"broker-{machine.index}")
        self.processes[machine.index] = broker
        return broker

    def role(self, machine: Machine) -> str | None:
        try:
            state = monitor_client.status(f"tcp://{machine.address}:47293", timeout=0.5)
        except BrokerUnavailable:
            return None
        return (state.get("ha") or {}).get("role")

    def wait_role(self, machine: Machine, role: str, timeout: float) -> None:
        broker = self.processes[machine.index]
        wait_until(
            lambda: self.role(machine) == role,
            f"broker-{machine.index} to be {role}",
            timeout,
            procs=[broker],
        )

    def first(self) -> None:
        one, two = self.net[1], self.net[2]
        self.start(one)
        self.wait_role(one, "active", 60)
        self.net.add_address(one, self.vip)
        self.active = (one, self.processes[1])
        self.start(two)
        self.wait_role(two, "standby", 60)
        self.wait_serving()

    def fail_over(self) -> None:
        assert self.active is not None
        old_machine, old = self.active
        machine = self.net[2 if old_machine.index == 1 else 1]
        self.procs.send_signal(old, signal.SIGKILL)
        self.procs.wait_for_exit(old, timeout=15)
        self.wait_role(machine, "active", 15)
        self.net.move_address(self.vip, machine)
        self.active = (machine, self.processes[machine.index])
        self.wait_serving()


def standby_missing() -> str | None:
    """Why the active/standby broker cannot run here (None: it can)."""
    needed = ("emq_django.broker.ha", "emq_django.broker.journal_pg", "tests.support.postgres")
    for module in needed:
        if importlib.util.find_spec(module) is None:
            return f"{module} is not in this tree (the active/standby broker, issue 32)"
    from tests.support.postgres import pg_available

    return pg_available()


@pytest.fixture(params=["handover", "standby"])
def brokers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Brokers]:
    """``handover``: the second broker starts on the first's SQLite journal after the
    kill. ``standby``: both run on a PostgreSQL of the test's own (listening on the
    bridge, which both machines reach), the second as a standby."""
    reason = why_not() or (standby_missing() if request.param == "standby" else None)
    if reason:
        pytest.skip(reason)
    jobmanager = Path(sys.executable).parent / "emq-jobmanager"
    if not jobmanager.exists():
        pytest.skip(f"{jobmanager} is missing: run `make venv` (eventmq==0.3.13)")
    with Network(2) as net, EmqProcesses(tmp_path / "logs") as procs:
        try:
            if request.param == "handover":
                yield Brokers(net, procs, tmp_path)
            else:
                from tests.support.postgres import PgCluster

                with PgCluster(tmp_path / "pg", host=net.hub) as pg:
                    yield StandbyBrokers(net, procs, tmp_path, pg.create_database("emq"))
                    procs.stop_all()  # before PostgreSQL goes
        finally:
            procs.stop_all()  # before the namespaces go


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    pzq_client.close_all()
    context.destroy(linger=0)


def start_eventmq_jobmanager(brokers: Brokers, marker: Path) -> ManagedProcess:
    """EventMQ's own job manager, in the root namespace, on the VIP."""
    argv = [str(Path(sys.executable).parent / "emq-jobmanager")]
    argv += ["--broker-addr", url(brokers.vip, "EMQ_BACKEND_BIND")]
    pythonpath = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return brokers.procs.start_program(
        argv,
        name="eventmq-jobmanager",
        env={
            "PYTHONPATH": pythonpath,
            "EVENTMQ_CONFIG_FILE": "/nonexistent",
            "EVENTMQ_QUEUES": '[[10, "default"]]',
            "EVENTMQ_CONCURRENT_JOBS": "2",
            interop_tasks.MARKER_ENV: str(marker),
        },
    )


def start_majortomo_worker(brokers: Brokers) -> ManagedProcess:
    argv = [sys.executable, "-m", "tests.e2e.mdp_worker", url(brokers.vip, "EMQ_MDP_BIND")]
    return brokers.procs.start_program([*argv, SERVICE, "echo"], name="majortomo-worker")


def mdp_request(client: Any, body: bytes) -> list[bytes]:
    client.send(SERVICE.encode(), body)
    return list(client.recv_all_as_list(timeout=20.0))


def pzq_round(producer: pzq_client.Producer, consumer: pzq_client.Consumer, tag: bytes) -> None:
    """One message through PZQ: confirmed '1' to the producer, delivered and acked."""
    producer.send(tag, b"body-" + tag)
    answers = producer.answers(1, timeout=20)
    assert answers[tag][0] == b"1", answers
    delivery = consumer.recv(timeout=20)
    assert delivery is not None, f"PZQ: {tag!r} was not delivered"
    assert delivery.body == [b"body-" + tag]
    consumer.ack(delivery)


def bus_round(bus: eventbus_client.BusClient, tag: str) -> int:
    """One event published on the Event BUS and received by the subscriber; its seq.
    Published again until it arrives: a SUB that has just connected again misses what
    was published before its subscription reached the broker (the document's slow
    joiner), and a duplicate is told apart by its data."""
    for _ in range(40):
        bus.publish("/ha/events", tag)
        event = bus.receive(timeout=0.5)
        while event is not None and event.data != tag:
            event = bus.receive(timeout=0.5)
        if event is not None:
            return event.seq
    raise AssertionError(f"Event BUS: {tag!r} never reached the subscriber")


def mc0_round(node: mc0_client.Mc0Client, talker: mc0_client.Mc0Client, body: bytes) -> None:
    talker.put("ha", body)
    got = node.recv(timeout=20, verb=b"MESSAGE")
    assert got is not None and got.positional[-1] == body, got


def test_foreign_clients_keep_working_after_a_failover_that_moves_the_address(
    brokers: Brokers, ctx: zmq.Context[Any], tmp_path: Path
) -> None:
    brokers.first()
    vip = brokers.vip
    marker = tmp_path / "marker.txt"
    jm = start_eventmq_jobmanager(brokers, marker)
    worker = start_majortomo_worker(brokers)
    wait_until(lambda: brokers.free_slots("default") >= 2, "EventMQ's 2 slots", 30, procs=[jm])
    wait_until(lambda: brokers.free_slots(SERVICE) >= 1, "the majortomo worker", 30, procs=[worker])

    mdp = majortomo.Client(url(vip, "EMQ_MDP_BIND"))
    mdp.connect()
    producer = pzq_client.Producer(ctx, url(vip, "EMQ_PZQ_RECEIVE_BIND"))
    consumer = pzq_client.Consumer(ctx, url(vip, "EMQ_PZQ_SEND_BIND"))
    bus = eventbus_client.BusClient(
        url(vip, "EMQ_BUS_SNAPSHOT_BIND"),
        url(vip, "EMQ_BUS_PUBLISH_BIND"),
        url(vip, "EMQ_BUS_COLLECT_BIND"),
        ctx,
    )
    bus.subscribe("/ha/")
    node = mc0_client.Mc0Client(ctx, url(vip, "EMQ_MC0_BIND"))
    talker = mc0_client.Mc0Client(ctx, url(vip, "EMQ_MC0_BIND"))
    for connector in (node, talker):
        connector.connect()
    node.sub("ha")

    reset_client()
    with override_settings(EMQ_BROKER_URL=url(vip, "EMQ_FRONTEND_BIND"), EMQ_EAGER=False):
        try:
            # before: every client works through the first broker
            assert interop_tasks.add.delay(2, 3).get(timeout=20) == 5
            assert mdp_request(mdp, b"before") == [b"before"]
            pzq_round(producer, consumer, b"before")
            seq_before = bus_round(bus, "before")
            mc0_round(node, talker, b"before")

            brokers.fail_over()

            # after: the same clients, on the same sockets, through the second broker
            wait_until(
                lambda: brokers.free_slots("default") >= 2,
                "EventMQ's job manager to rejoin the new broker",
                EVENTMQ_REJOIN,
                procs=[jm],
            )
            assert interop_tasks.add.delay(20, 22).get(timeout=20) == 42
            assert "add 20 22" in marker.read_text().splitlines()

            wait_until(
                lambda: brokers.free_slots(SERVICE) >= 1,
                "the majortomo worker to rejoin",
                30,
                procs=[worker],
            )
            assert mdp_request(mdp, b"after") == [b"after"]

            pzq_round(producer, consumer, b"after")

            seq_after = bus_round(bus, f"after-{uuid.uuid4()}")
            assert seq_after > seq_before  # numbered on: the topic store is in the journal

            for connector in (node, talker):  # the new broker never heard of them
                connector.connect()
            node.sub("ha")
            mc0_round(node, talker, b"after")
            assert jm.alive() and worker.alive()
        finally:
            mdp.close()
            bus.close()
            node.close()
            talker.close()
            reset_client()
