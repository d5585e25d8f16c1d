"""Issue 16's attacks against a real CURVE broker (``manage.py emq_broker``) with its
allow-list in the database (``manage.py emq_keys``), each of which must fail; and
jobs flowing end to end (client, broker, job manager) with CURVE on.

The keys: the broker's pair; ``jm`` (worker), ``app`` (client, monitor), ``watch``
(monitor), ``ops`` (admin). The attackers are real sockets in this process.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from emq_django import pubsub, transport
from emq_django.client import reset_client
from emq_django.conf import reset_cached_settings
from emq_django.exceptions import BatchUnacknowledged, BrokerUnavailable, HandshakeRefused
from emq_django.link import REFUSED_EXIT
from emq_django.monitor_client import query
from emq_django.protocol.frames import PROTOCOL
from emq_django.security.keys import CurveKeys, read_key
from emq_django.transport import SocketOptions
from tests.e2e import spine_tasks as tasks
from tests.e2e.test_spine import start_jm, wait_jm_ready
from tests.mc0_client import Mc0Client
from tests.support import (
    REPO_ROOT,
    EmqProcesses,
    ManagedProcess,
    free_tcp_port,
    start_broker,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RELOAD = 1.0  # EMQ_KEYS_RELOAD of the broker under test
REFUSED_WAIT = 1.5  # how long a refused connection is given to (not) answer
KEYS = {
    "jm": "worker",
    "app": "client,monitor",
    "watch": "monitor",
    "ops": "admin,monitor",
    "bus": "publisher,subscriber",
    "reader": "subscriber",
}


@dataclass
class CurveStack:
    env: dict[str, str]
    keys_dir: Path
    db: Path
    broker: ManagedProcess
    server_public: bytes

    def keys(self, name: str) -> CurveKeys:
        secret = read_key("CURVE_SECRET_KEY", str(self.keys_dir / f"{name}.key_secret"), True)
        return CurveKeys(zmq.curve_public(secret), secret, self.server_public)

    def key_env(self, name: str) -> dict[str, str]:
        return {
            "EMQ_CURVE_SECRET_KEY": str(self.keys_dir / f"{name}.key_secret"),
            "EMQ_CURVE_SERVER_KEY": str(self.keys_dir / "broker.key"),
        }

    def monitor(self, request: bytes, key: str | None = "ops", timeout: float = 10.0) -> bytes:
        keys = self.keys(key) if key else None
        return query(self.env["EMQ_MONITOR_URL"], request, timeout, curve=keys)

    def status(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.monitor(b"MONITOR JSON"))
        return doc


@pytest.fixture(autouse=True)
def settings_of_this_process_after() -> Iterator[None]:
    """Set up before ``monkeypatch`` (autouse), so torn down after it has put the
    environment back: the cached settings and the client are dropped then, never
    kept with a test's CURVE keys and the stack's ports for the next test (a
    reset made inside the test, before monkeypatch's undo, could be re-cached
    from the test's environment by anything reading the settings in between)."""
    yield
    reset_client()
    reset_cached_settings()


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "manage.py"), *args],
        cwd=REPO_ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout


@pytest.fixture(scope="module")
def keys_template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A migrated database with the keys registered, and the key files: made once
    (six ``manage.py`` runs), copied for each test."""
    where = tmp_path_factory.mktemp("curve-keys")
    keys_dir, db = where / "keys", where / "db.sqlite3"
    env = {"DJANGO_SETTINGS_MODULE": "project.settings", "DATABASE_URL": f"sqlite:///{db}"}
    manage(env, "migrate", "-v0")
    manage(env, "emq_keys", "generate", "broker", "--server", "--dir", str(keys_dir))
    for name, roles in KEYS.items():
        manage(env, "emq_keys", "generate", name, "--roles", roles, "--dir", str(keys_dir))
    assert (keys_dir / "app.key_secret").stat().st_mode & 0o777 == 0o600
    assert "roles=client,monitor" in manage(env, "emq_keys", "list")
    return keys_dir, db


@pytest.fixture
def stack(
    emq_env: dict[str, str],
    emq_processes: EmqProcesses,
    keys_template: tuple[Path, Path],
) -> CurveStack:
    return start_curve_stack(emq_env, emq_processes, keys_template)


def start_curve_stack(
    emq_env: dict[str, str],
    emq_processes: EmqProcesses,
    keys_template: tuple[Path, Path],
    **extra_env: str,
) -> CurveStack:
    keys_dir, template_db = keys_template
    db = Path(emq_env["DATABASE_URL"].removeprefix("sqlite:///"))
    shutil.copyfile(template_db, db)
    broker = start_broker(
        emq_processes,
        emq_env,
        extra_env={
            "EMQ_CURVE_SECRET_KEY": str(keys_dir / "broker.key_secret"),
            "EMQ_KEYS_RELOAD": str(RELOAD),
            **extra_env,
        },
    )
    server_public = read_key("CURVE_SERVER_KEY", str(keys_dir / "broker.key"), False)
    return CurveStack({**emq_env, **extra_env}, keys_dir, db, broker, server_public)


def as_process(
    stack: CurveStack, monkeypatch: pytest.MonkeyPatch, keys: dict[str, str], **extra: str
) -> None:
    """This test process's settings: the stack's, with CURVE ``keys`` (EMQ_CURVE_*;
    none: plain text) and ``extra`` settings."""
    monkeypatch.delenv("EMQ_CURVE_SECRET_KEY", raising=False)
    monkeypatch.delenv("EMQ_CURVE_SERVER_KEY", raising=False)
    for key, value in {**stack.env, **keys, **extra}.items():
        if key != "DATABASE_URL":
            monkeypatch.setenv(key, value)
    reset_cached_settings()
    reset_client()


@pytest.fixture
def curve_client_env(stack: CurveStack, monkeypatch: pytest.MonkeyPatch) -> Iterator[CurveStack]:
    """This test process as the ``app`` client of the stack's broker."""
    as_process(stack, monkeypatch, stack.key_env("app"))
    yield stack
    reset_client()
    reset_cached_settings()


@pytest.fixture
def refused_client_env(stack: CurveStack, monkeypatch: pytest.MonkeyPatch) -> Iterator[CurveStack]:
    """This test process as a client holding the ``jm`` key (the worker role only),
    which the clients port refuses; an ACK time-out of 30 s, so that a refusal that
    was only noticed by the time-out would show as ``BrokerUnavailable``."""
    as_process(stack, monkeypatch, stack.key_env("jm"), EMQ_ACK_TIMEOUT="30")
    yield stack
    reset_client()
    reset_cached_settings()


def dealer(stack: CurveStack, url_setting: str, key: str | None, identity: bytes) -> Any:
    keys = stack.keys(key) if key else None
    options = SocketOptions(identity=identity, curve=keys)
    return transport.connect(zmq.Context.instance(), zmq.DEALER, stack.env[url_setting], options)


def test_jobs_flow_end_to_end_with_curve(
    curve_client_env: CurveStack, emq_processes: EmqProcesses
) -> None:
    stack = curve_client_env
    jm = start_jm(emq_processes, "secure", extra_env=stack.key_env("jm"))
    # the app key reads the monitor too (client,monitor): wait_jm_ready asks as it
    wait_jm_ready(stack.env, "secure", 2, [jm, stack.broker])
    assert tasks.add.delay(20, 22).get(timeout=15) == 42
    counters = stack.status()["counters"]
    assert counters["succeeded"] == 1
    assert counters["zap_admitted"] >= 3  # the job manager's links, the client, the monitor

    def last_seen(name: str) -> Any:
        with sqlite3.connect(stack.db) as db:
            row = db.execute(
                "SELECT last_seen FROM emq_security_authorizedkey WHERE name = ?", (name,)
            ).fetchone()
        return row[0]

    # written by the broker's reloader, in one batch per reload
    wait_until(lambda: last_seen("jm") and last_seen("app"), "last seen", 3 * RELOAD + 5)
    assert last_seen("watch") is None


def test_fake_job_manager_with_a_client_key_gets_no_job(
    curve_client_env: CurveStack,
) -> None:
    stack = curve_client_env
    fake = dealer(stack, "EMQ_WORKER_URL", "app", b"fake-jm")
    try:
        # NOBLOCK: once refused, the socket may have no connection to queue on
        for frames in (
            [b"", PROTOCOL, b"INFORM", b"i-1", b'[[1000, "spine"]]', b"worker"],
            [b"", PROTOCOL, b"READY", b"r-1"],
        ):
            with contextlib.suppress(zmq.Again):
                fake.send_multipart(frames, zmq.NOBLOCK)
        handles = [tasks.add.delay(i, 0) for i in range(6)]
        assert not fake.poll(int(REFUSED_WAIT * 1000)), "the fake job manager heard back"
    finally:
        fake.close(linger=0)
    doc = stack.status()
    assert doc["counters"]["zap_refused_role"] >= 1
    assert doc["job_managers"] == []
    assert {q["name"]: q["depth"] for q in doc["queues"]}["spine"] == len(handles)


@pytest.mark.parametrize("key", [None, "stranger", "watch"])
def test_monitor_cancel_and_purge_refused_without_admin_key(
    stack: CurveStack, key: str | None
) -> None:
    if key == "stranger":  # a key pair the database never heard of
        public, secret = zmq.curve_keypair()
        keys: CurveKeys | None = CurveKeys(public, secret, stack.server_public)
    else:
        keys = stack.keys(key) if key else None
    for request in (b"DEADLETTERS PURGE ALL", b"CANCEL some-job"):
        try:
            answer = query(stack.env["EMQ_MONITOR_URL"], request, REFUSED_WAIT, curve=keys)
        except BrokerUnavailable:
            answer = None
        if key == "watch":  # admitted to read, refused to change
            assert answer is not None and answer.startswith(b"ERROR forbidden")
        else:
            assert answer is None
            # told why at the handshake, not after the time-out
            with pytest.raises(HandshakeRefused) as refused:
                query(stack.env["EMQ_MONITOR_URL"], request, 30.0, curve=keys)
            assert_refused(refused.value, key)
    counters = stack.status()["counters"]
    if key == "stranger":
        assert counters["zap_refused_unknown"] >= 2
    if key is None:  # plain text: libzmq refuses it in the handshake, before ZAP
        assert counters["handshake_failed"] >= 2
    if key == "watch":
        assert counters["refused_forbidden"] == 2
    assert counters["cancelled"] == 0
    # the admin key may: the same commands answer
    assert json.loads(stack.monitor(b"DEADLETTERS PURGE ALL")) == {"purged": 0}


def test_client_key_on_the_worker_port_is_refused_and_counted(stack: CurveStack) -> None:
    sock = dealer(stack, "EMQ_WORKER_URL", "app", b"intruder")
    try:
        sock.send_multipart([b"", PROTOCOL, b"INFORM", b"i-1", b'[[10, "spine"]]', b"worker"])
        assert not sock.poll(int(REFUSED_WAIT * 1000))
    finally:
        sock.close(linger=0)
    assert stack.status()["counters"]["zap_refused_role"] >= 1
    assert "refused key" in stack.broker.stderr() and "app" in stack.broker.stderr()


def test_revoked_key_is_cut_off_within_the_reload(
    stack: CurveStack, emq_processes: EmqProcesses
) -> None:
    worker = dealer(stack, "EMQ_WORKER_URL", "jm", b"soon-revoked")
    try:
        worker.send_multipart([b"", PROTOCOL, b"INFORM", b"i-1", b'[[10, "spine"]]', b"worker"])
        wait_until(lambda: len(stack.status()["job_managers"]) == 1, "the job manager", 10.0)
        # as the admin would: the row disabled in the database
        with sqlite3.connect(stack.db) as db:
            db.execute("UPDATE emq_security_authorizedkey SET enabled = 0 WHERE name = 'jm'")
        revoked_at = time.monotonic()
        wait_until(
            lambda: not stack.status()["job_managers"], "the revoked job manager dropped", 10.0
        )
        took = time.monotonic() - revoked_at
        assert took <= RELOAD + 1.0, f"cut off after {took:.2f} s"
        worker.send_multipart([b"", PROTOCOL, b"HEARTBEAT", b"h-1", b"0"])
        wait_until(lambda: stack.status()["counters"]["dropped_revoked"] >= 1, "dropped", 5.0)
    finally:
        worker.close(linger=0)
    assert stack.status()["counters"]["peers_revoked"] == 1


# ---- refusals reach the caller at once, with the reason ----------------------------------


def assert_refused(exc: HandshakeRefused, key: str | None) -> None:
    """A refusal of an unknown key is ZAP's 400; a plain-text connection fails the
    handshake on the mechanism (libzmq reports a mismatch, or, when the broker closed
    before it read the broker's greeting, failures without detail): both say CURVE."""
    if key is not None:
        assert (exc.kind, exc.code) == ("auth", 400), exc
        assert "ZAP: 400" in str(exc)
    else:
        assert exc.kind in ("protocol", "no-detail"), exc
        assert "EMQ_CURVE_SECRET_KEY" in str(exc)


def test_delay_with_a_refused_key_raises_the_reason_not_the_time_out(
    refused_client_env: CurveStack,
) -> None:
    stack = refused_client_env
    jm_public = stack.keys("jm").public.decode()
    for _ in range(2):  # and again: a fresh socket, refused again, never blocked
        with pytest.raises(HandshakeRefused) as refused:
            tasks.add.delay(1, 2)
        # the ACK time-out is 30 s: had the client waited for it, this would be the
        # time-out's plain BrokerUnavailable
        assert refused.type is HandshakeRefused
        assert (refused.value.kind, refused.value.code) == ("auth", 400)
        text = str(refused.value)
        assert f"the broker at {stack.env['EMQ_BROKER_URL']} refused" in text
        assert jm_public in text and "ZAP: 400" in text and "the client role" in text
    with pytest.raises(BatchUnacknowledged) as batch:
        tasks.add.map([(i, 0) for i in range(5)])
    assert isinstance(batch.value.__cause__, HandshakeRefused)
    assert "ZAP: 400" in str(batch.value) and len(batch.value.job_ids) == 5
    assert stack.status()["counters"]["zap_refused_role"] >= 3


@pytest.mark.parametrize("command", ["emq_jobmanager", "emq_scheduler"])
def test_peer_with_a_refused_key_exits_naming_the_cause(
    stack: CurveStack, emq_processes: EmqProcesses, command: str
) -> None:
    if command == "emq_jobmanager":
        # the app key (client, monitor) is no worker: the workers port refuses it
        key, role = "app", "worker"
        proc = start_jm(emq_processes, "refused", extra_env=stack.key_env(key))
    else:  # the jm key (worker) can neither send jobs nor schedule on the clients port
        key, role = "jm", "scheduler"
        proc = emq_processes.start("emq_scheduler", env=stack.key_env(key), name="sched")
    code = proc.popen.wait(timeout=60)  # it stops by itself; the bound only ends a hang
    assert code == REFUSED_EXIT, proc.log_tail()
    log = proc.stderr()
    assert stack.keys(key).public.decode() in log
    assert "refused this process's CURVE key" in log and "ZAP: 400" in log
    assert f"Stopping (exit code {REFUSED_EXIT})" in log and f"the {role} role" in log
    assert stack.status()["job_managers"] == []


@pytest.mark.parametrize("key", ["stranger", None])
def test_publish_and_subscribe_refused_say_why(
    stack: CurveStack, monkeypatch: pytest.MonkeyPatch, key: str | None
) -> None:
    if key == "stranger":  # a key pair the allow-list never heard of
        _, secret = zmq.curve_keypair()
        keys = {**stack.key_env("app"), "EMQ_CURVE_SECRET_KEY": secret.decode()}
    else:
        keys = {}
    as_process(stack, monkeypatch, keys)
    try:
        for _ in range(2):  # the refused socket is closed: the next publish tries afresh
            with pytest.raises(HandshakeRefused) as refused:
                pubsub.publish("/refused/a", {"n": 1})
            assert_refused(refused.value, key)
        with pytest.raises(HandshakeRefused) as refused:
            pubsub.publish_many("/refused/a", [{"n": 2}, {"n": 3}])
        assert_refused(refused.value, key)
        with pubsub.subscribe("/refused/", since=0) as sub:
            with pytest.raises(HandshakeRefused) as refused:
                sub.next(timeout=30.0)
        assert_refused(refused.value, key)
    finally:
        reset_cached_settings()
    assert stack.status()["topics"]["last_seq"] == 0  # nothing got in


def test_publish_and_subscribe_with_curve(
    stack: CurveStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_process(stack, monkeypatch, stack.key_env("bus"))  # publisher,subscriber
    try:
        with pubsub.subscribe("/secure/", since=0) as sub:
            pubsub.publish("/secure/a", {"n": 1})
            event = sub.next(timeout=15.0)
    finally:
        reset_cached_settings()
    assert event is not None and (event.topic, event.data) == ("/secure/a", {"n": 1})


def test_event_bus_ports_admit_only_their_roles(
    stack: CurveStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The collector wants a ``publisher`` key, the snapshot and publisher sockets a
    ``subscriber`` key: a client key publishes nothing, a reader key reads but
    cannot publish, and each refusal names the key's roles."""
    try:
        as_process(stack, monkeypatch, stack.key_env("app"))  # client,monitor
        with pytest.raises(HandshakeRefused) as refused:
            pubsub.publish("/roles/a", {"n": 1})
        assert (refused.value.kind, refused.value.code) == ("auth", 400), refused.value
        with pubsub.subscribe("/roles/", since=0) as sub:
            with pytest.raises(HandshakeRefused):
                sub.next(timeout=30.0)

        as_process(stack, monkeypatch, stack.key_env("reader"))  # subscriber only
        with pytest.raises(HandshakeRefused) as refused:
            pubsub.publish("/roles/a", {"n": 2})
        assert (refused.value.kind, refused.value.code) == ("auth", 400), refused.value

        as_process(stack, monkeypatch, stack.key_env("bus"))
        pubsub.publish("/roles/a", {"n": 3})
        as_process(stack, monkeypatch, stack.key_env("reader"))
        with pubsub.subscribe("/roles/", since=0) as sub:
            event = sub.next(timeout=15.0)
        assert event is not None and event.data == {"n": 3}
    finally:
        reset_cached_settings()
    assert stack.status()["counters"]["zap_refused_role"] >= 3


@pytest.fixture
def forty_character_key_path(stack: CurveStack) -> Iterator[str]:
    """The broker's public key file at a path of exactly 40 characters, all of them
    Z85 characters: it decodes as a key too."""
    import uuid

    from emq_django.security.keys import is_z85_key

    name = "broker.key"
    where = Path(f"/tmp/emq{uuid.uuid4().hex}"[: 40 - len(name) - 1])
    where.mkdir()
    try:
        path = where / name
        shutil.copyfile(stack.keys_dir / name, path)
        assert len(str(path)) == 40 and is_z85_key(str(path))
        yield str(path)
    finally:
        shutil.rmtree(where)


def test_a_key_file_path_of_40_characters_is_read_as_a_file(
    curve_client_env: CurveStack, emq_processes: EmqProcesses, forty_character_key_path: str
) -> None:
    """Such a path was taken as the key itself: every job manager exited 78 and
    every client blamed the key (issue 29, item 17). A file that exists is a file."""
    stack = curve_client_env
    env = {**stack.key_env("jm"), "EMQ_CURVE_SERVER_KEY": forty_character_key_path}
    jm = start_jm(emq_processes, "secure", extra_env=env)
    wait_jm_ready(stack.env, "secure", 2, [jm, stack.broker])
    assert tasks.add.delay(1, 2).get(timeout=15) == 3


def test_revoked_key_gets_no_event_on_any_path(
    emq_env: dict[str, str],
    emq_processes: EmqProcesses,
    keys_template: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 30, item 6: once the broker has reloaded its keys, a revoked
    ``subscriber`` key gets no more events on the Event BUS publisher, on emq's
    batch publisher or in its mc0 session, while a kept key gets them all; the
    revoked subscriber is told (``HandshakeRefused``), not left waiting."""
    batch = f"tcp://127.0.0.1:{free_tcp_port()}"
    stack = start_curve_stack(emq_env, emq_processes, keys_template, EMQ_BUS_BATCH_BIND=batch)
    as_process(stack, monkeypatch, stack.key_env("bus"))  # publishes with the bus key
    publisher = stack.env["EMQ_BUS_PUBLISH_BIND"]

    def subscribe(key: str, **where: str) -> pubsub.Subscription:
        return pubsub.subscribe("/rv/", since=0, curve=stack.keys(key), idle_check=0.2, **where)

    subs = {
        ("reader", "bus"): subscribe("reader", publish_url=publisher),
        ("reader", "batch"): subscribe("reader", batch_url=batch),
        ("bus", "bus"): subscribe("bus", publish_url=publisher),
        ("bus", "batch"): subscribe("bus", batch_url=batch),
    }
    connectors = {key: mc0_connector(stack, key) for key in ("reader", "bus")}
    try:
        pubsub.publish("/rv/a", {"before": 0})
        for where, sub in subs.items():
            event = sub.next(timeout=15.0)
            assert event is not None and event.data == {"before": 0}, where
        for key, connector in connectors.items():
            assert len(connector.messages(1, timeout=15.0)) == 1, key

        with sqlite3.connect(stack.db) as db:
            db.execute("UPDATE emq_security_authorizedkey SET enabled = 0 WHERE name = 'reader'")
        wait_until(lambda: refuses_now(stack, "reader"), "the reader key refused", 10.0)
        for i in range(5):
            pubsub.publish("/rv/a", {"after": i})

        for where in (("bus", "bus"), ("bus", "batch")):
            got = [subs[where].next(timeout=15.0) for _ in range(5)]
            assert [e.data if e else None for e in got] == [{"after": i} for i in range(5)]
        kept = connectors["bus"].messages(5, timeout=15.0)
        assert [msgpack.unpackb(m.positional[0]) for m in kept] == [{"after": i} for i in range(5)]

        for where in (("reader", "bus"), ("reader", "batch")):
            seen, refused = rest_of(subs[where])
            assert not [d for d in seen if "after" in d], (where, seen)
            assert refused is not None, f"{where}: not told of its revocation"
        late = connectors["reader"].messages(5, timeout=2.0)
        assert not late, [msgpack.unpackb(m.positional[0]) for m in late]
    finally:
        for sub in subs.values():
            sub.close()
        for connector in connectors.values():
            connector.close()
    counters = stack.status()["counters"]
    assert counters["publishers_rebound"] == 2  # the Event BUS publisher, the batch one
    assert counters["peers_revoked"] >= 1  # the mc0 session


def mc0_connector(stack: CurveStack, key: str) -> Mc0Client:
    keys = stack.keys(key)
    curve = (stack.server_public, keys.public, keys.secret)
    connector = Mc0Client(zmq.Context.instance(), stack.env["EMQ_MC0_BIND"], curve=curve)
    connector.connect()
    connector.sub("/rv/a")
    return connector


def refuses_now(stack: CurveStack, key: str) -> bool:
    """A fresh subscription with ``key`` is refused: the broker reloaded its keys."""
    with pubsub.subscribe("/rv/", since=0, curve=stack.keys(key), idle_check=0.2) as probe:
        try:
            probe.next(timeout=2.0)
        except HandshakeRefused:
            return True
    return False


def rest_of(sub: pubsub.Subscription) -> tuple[list[Any], HandshakeRefused | None]:
    """What ``sub`` still gets until nothing comes for 10 s, or until it is refused."""
    seen = []
    try:
        while (event := sub.next(timeout=10.0)) is not None:
            seen.append(event.data)
    except HandshakeRefused as exc:
        return seen, exc
    return seen, None


def test_a_majordomo_request_the_key_may_not_send_gets_a_final_with_the_reason(
    stack: CurveStack,
) -> None:
    """Issue 29, item 15: the released majortomo 0.2.0 client holding a ``worker``
    key (admitted on the Majordomo port, which serves workers too) sends a
    request: it is answered with a FINAL saying why, not left waiting."""
    majortomo = pytest.importorskip("majortomo")
    keys = stack.keys("jm")
    ctx = zmq.Context()
    # the client makes its own socket: CURVE comes from the context's defaults
    ctx.curve_serverkey, ctx.curve_publickey, ctx.curve_secretkey = (
        stack.server_public,
        keys.public,
        keys.secret,
    )
    try:
        with majortomo.Client(stack.env["EMQ_MDP_BIND"], zmq_context=ctx) as client:
            client.connect()
            client.send(b"spine", b"body")
            (final,) = list(client.recv_all(timeout=10))
    finally:
        ctx.destroy(linger=0)
    error = json.loads(final[0])["error"]
    assert error["type"] == "emq_django.exceptions.JobRefused", error
    assert "forbidden" in error["message"] and "client role" in error["message"], error
    assert stack.status()["counters"]["refused_forbidden"] == 1
