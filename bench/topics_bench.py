"""Topics: one publisher, 10 subscribers, 1 KB events, against Redis pub/sub and NATS.

    .venv/bin/python bench/topics_bench.py [--events 20000] [--subscribers 10]
        [--rate 1000] [--latency-seconds 5] [--rounds 2]
        [--only emq,emq-raw,redis,nats,jetstream] [--json bench/results/topics-<date>-<label>.json]

Two figures per system, systems alternating over ``--rounds`` rounds:

- **delivered events/s**: the publisher sends ``--events`` events as fast as its
  client accepts them; every subscriber counts what it receives. events/s =
  deliveries at all subscribers / subscribers / (last delivery at any subscriber -
  first send). A subscriber that misses events (Redis drops a slow one) lowers
  the figure; the misses are reported too.
- **publish-to-delivery p50/p99** at a fixed ``--rate`` (1,000 events/s): every
  event carries ``time.monotonic_ns()`` read just before the publish call, and
  each subscriber reads the same clock (one machine) when its client hands it the
  event; p50/p99 over every delivery at every subscriber.

Each subscriber and the publisher is a process of its own. Before each phase the
publisher sends warm-up events (marked, not counted) until every subscriber has
seen one, so a subscription still being set up (ZeroMQ's and Redis' late joiners)
costs nothing measured.

The systems (the peers with their documented fast paths):

- ``emq``: ``emq.subscribe()`` through ``manage.py emq_broker`` on private
  loopback ports, its durable event store on (the default), reading the broker's
  batch publisher (``EMQ_BUS_BATCH_BIND``: several events a message in a burst,
  one at a time otherwise); the publisher calls ``emq.publish_many()`` with 100
  events a call (throughput, as Redis' pipeline of 100) and ``emq.publish()``
  once per event (latency), both confirmed by the broker (pipelined: the phase
  ends with ``emq.wait_published()``);
- ``emq-raw``: the same broker through the Event BUS wire alone: a bare producer
  (pyzmq and msgpack, one PUB per event) and subscribers reading the Event BUS
  PUB socket with pyzmq alone (what a micro-toolkit client gets);
- ``redis``: Redis pub/sub on 127.0.0.1:6379 (redis-py, hiredis parser when
  installed); the publisher pipelines 100 PUBLISHes per round trip (throughput),
  one PUBLISH per event (latency);
- ``nats``: NATS core on 127.0.0.1:4222 (nats-py, callback subscriptions);
- ``jetstream``: NATS JetStream, a file-storage stream (made anew per phase), one
  ephemeral push consumer per subscriber (deliver new, no acks), the publisher
  using ``publish_async`` (acknowledged, at most 1,000 outstanding) for
  throughput and ``publish`` (waits for the ack) for latency.

Peers' addresses: ``BENCH_REDIS_URL``, ``BENCH_NATS_URL``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.procs import PYTHON, REPO, ServerSet, base_env, free_port  # noqa: E402

SYSTEMS = ("emq", "emq-raw", "redis", "nats", "jetstream")
EVENT_SIZE = 1024
HEAD = struct.Struct("<qq")  # seq (-1: warm-up), monotonic_ns at the publish call
WARM = -1
IDLE_END = 5.0  # a subscriber stops this long after its last event (missed events)
LATE_MS = 50  # an event this late at a subscriber counts as late (where the tail comes from)
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
NATS_URL = os.environ.get("BENCH_NATS_URL", "nats://127.0.0.1:4222")
JS_STREAM = "EMQBENCHTOPICS"


def payload(seq: int) -> bytes:
    head = HEAD.pack(seq, time.monotonic_ns())
    return head + b"x" * (EVENT_SIZE - len(head))


# ---------------------------------------------------------------- subscriber side


class Tally:
    """What one subscriber saw; ``feed`` is called with every event's bytes."""

    def __init__(self, expected: int, report: Any, sub_id: int, latency: bool) -> None:
        self.expected = expected
        self.report = report
        self.sub_id = sub_id
        self.latency = latency
        self.count = 0
        self.first_ns = 0
        self.last_ns = 0
        self.lags: list[int] = []
        self.warm = False
        self.last_seen = time.monotonic()
        self.extra: dict[str, int] = {}  # the client's own figures (gaps filled, syncs)
        self.cpu_first = 0.0  # CPU seconds when the first counted event came

    def feed(self, data: bytes) -> None:
        now = time.monotonic_ns()
        seq, stamp = HEAD.unpack_from(data)
        if seq == WARM:
            if not self.warm:
                self.warm = True
                self.report.send_json({"kind": "warm", "id": self.sub_id})
            return
        self.count += 1
        if not self.first_ns:
            self.first_ns = now
            self.cpu_first = time.process_time()
        self.last_ns = now
        if self.latency:
            self.lags.append(now - stamp)

    def done(self) -> bool:
        return self.count >= self.expected

    def idle(self) -> bool:
        return self.count > 0 and time.monotonic() - self.last_seen > IDLE_END

    def finish(self) -> None:
        self.report.send_json(
            {
                "kind": "done",
                "id": self.sub_id,
                "count": self.count,
                "first_ns": self.first_ns,
                "last_ns": self.last_ns,
                "lags": self.lags,
                "cpu_s": time.process_time(),
                "phase_cpu_s": time.process_time() - self.cpu_first if self.count else 0.0,
                **self.extra,
            }
        )


def run_subscriber(system: str, topic: str, tally: Tally, env: dict[str, str]) -> None:
    deadline = time.monotonic() + 600
    if system in ("nats", "jetstream"):
        asyncio.run(_nats_subscriber(system, topic, tally, deadline))
    elif system == "redis":
        _redis_subscriber(topic, tally, deadline)
    elif system == "emq":
        _emq_subscriber(topic, tally, deadline)
    elif system == "emq-raw":
        _emq_raw_subscriber(topic, tally, deadline, env)
    tally.finish()


def _loop(get: Callable[[float], bytes | None], tally: Tally, deadline: float) -> None:
    while not tally.done() and time.monotonic() < deadline and not tally.idle():
        data = get(0.5)
        if data is not None:
            tally.last_seen = time.monotonic()
            tally.feed(data)


def _redis_subscriber(topic: str, tally: Tally, deadline: float) -> None:
    import redis

    pubsub = redis.Redis.from_url(REDIS_URL).pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(topic)

    def get(timeout: float) -> bytes | None:
        message = pubsub.get_message(timeout=timeout)
        return None if message is None else message["data"]

    _loop(get, tally, deadline)
    pubsub.close()


async def _nats_subscriber(system: str, topic: str, tally: Tally, deadline: float) -> None:
    import nats

    nc = await nats.connect(NATS_URL)
    done = asyncio.Event()

    async def on_message(msg: Any) -> None:
        tally.last_seen = time.monotonic()
        tally.feed(msg.data)
        if tally.done():
            done.set()

    limits = {"pending_msgs_limit": 1_000_000, "pending_bytes_limit": 2**31}
    if system == "nats":
        await nc.subscribe(topic, cb=on_message, **limits)
    else:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        js = nc.jetstream()
        config = ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.NEW)
        await js.subscribe(
            topic, stream=JS_STREAM, cb=on_message, config=config, manual_ack=True, **limits
        )
    await nc.flush()
    while not done.is_set() and time.monotonic() < deadline and not tally.idle():
        try:
            await asyncio.wait_for(done.wait(), 0.5)
        except TimeoutError:
            pass
    await nc.close()


def _emq_subscriber(topic: str, tally: Tally, deadline: float) -> None:
    import django

    django.setup()
    import emq_django as emq

    subscription = emq.subscribe(topic)  # live events; gaps filled from the snapshot

    def get(timeout: float) -> bytes | None:
        event = subscription.next(timeout=timeout)
        return None if event is None else event.data  # raw bytes published: bytes back

    _loop(get, tally, deadline)
    st = subscription.state
    tally.extra = {"gaps": st.gaps, "syncs": st.syncs, "from_snapshot": st.from_snapshot}
    print(f"subscriber {tally.sub_id}: {tally.count} events, {tally.extra}", file=sys.stderr)
    subscription.close()


def _emq_raw_subscriber(topic: str, tally: Tally, deadline: float, env: dict[str, str]) -> None:
    """pyzmq and msgpack alone on the Event BUS publisher socket: a BROADCAST is
    [topic, seq, producer, timestamp, uuid, MessagePack data]."""
    import msgpack
    import zmq

    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.connect(env["EMQ_BUS_PUBLISH_BIND"])
    sock.subscribe(topic.encode())

    def get(timeout: float) -> bytes | None:
        if not sock.poll(int(timeout * 1000)):
            return None
        return msgpack.unpackb(sock.recv_multipart()[-1])  # type: ignore[no-any-return]

    _loop(get, tally, deadline)
    sock.close(linger=0)


# ---------------------------------------------------------------- publisher side


class Control:
    """The harness's "go" (a PULL the harness PUSHes to) and our report back."""

    def __init__(self, ctl_url: str, report: Any) -> None:
        import zmq

        self.sock = zmq.Context.instance().socket(zmq.PULL)
        self.sock.connect(ctl_url)
        self.report = report

    def go(self) -> bool:
        return bool(self.sock.poll(0)) and self.sock.recv() == b"go"


def run_publisher(system: str, topic: str, opts: argparse.Namespace, ctl: Control) -> None:
    if system in ("nats", "jetstream"):
        asyncio.run(_nats_publisher(system, topic, opts, ctl))
        return
    if system == "redis":
        import redis

        client = redis.Redis.from_url(REDIS_URL)

        def send(data: bytes) -> None:
            client.publish(topic, data)

        def send_many(n: int) -> None:
            for start in range(0, n, 100):
                pipe = client.pipeline(transaction=False)
                for seq in range(start, min(n, start + 100)):
                    pipe.publish(topic, payload(seq))
                pipe.execute()

        def flush() -> None:
            pass

    elif system == "emq-raw":
        send, close = _bus_sender(topic)

        def send_many(n: int) -> None:
            for seq in range(n):
                send(payload(seq))

        def flush() -> None:
            # the bus never acknowledges; the subscribers' counts end the phase.
            # What still waits in the pipe leaves before the process ends (as
            # emq.publish's socket at exit: pubsub._Publisher.close_all)
            close()

    else:
        import django

        django.setup()
        import emq_django as emq

        def send(data: bytes) -> None:
            emq.publish(topic, data)  # raw bytes: application/octet-stream

        def send_many(n: int) -> None:
            for start in range(0, n, 100):  # as Redis' pipeline: 100 a call
                emq.publish_many(topic, [payload(seq) for seq in range(start, min(n, start + 100))])

        def flush() -> None:
            emq.wait_published()  # every event confirmed (numbered and journaled)

    while not ctl.go():  # warm-up until every subscriber has seen one
        send(payload(WARM))
        time.sleep(0.02)
    start = time.monotonic_ns()
    wall_start = time.time()
    cpu_start = time.process_time()
    if opts.phase == "thr":
        send_many(opts.events)
    else:
        paced(opts.events, opts.rate, lambda seq: send(payload(seq)))
    flush()
    ctl.report.send_json(
        {
            "kind": "published",
            "start_ns": start,
            "wall_start": wall_start,
            "end_ns": time.monotonic_ns(),
            "cpu_s": time.process_time(),
            "phase_cpu_s": time.process_time() - cpu_start,
        }
    )


def _bus_sender(topic: str) -> tuple[Callable[[bytes], None], Callable[[], None]]:
    """An Event BUS producer (DEALER to the collector): PUB frames, MessagePack data;
    and its close, which returns once what was sent has left (or 10 s)."""
    import uuid
    from datetime import UTC, datetime

    import msgpack
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 10_000
    sock.connect(os.environ["EMQ_BUS_COLLECT_BIND"])
    head = [topic.encode(), b"", b"topics-bench"]

    def send(data: bytes) -> None:
        stamp = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        sock.send_multipart(
            [*head, stamp.encode(), str(uuid.uuid4()).encode(), msgpack.packb(data)]
        )

    def close() -> None:
        sock.close()
        ctx.term()

    return send, close


def paced(n: int, rate: float, send: Callable[[int], None]) -> None:
    """Event ``seq`` goes at start + seq/rate (no catching up in bursts after a stall)."""
    gap = 1.0 / rate
    due = time.monotonic()
    for seq in range(n):
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        send(seq)
        due = max(due + gap, time.monotonic() - gap)


async def _nats_publisher(system: str, topic: str, opts: argparse.Namespace, ctl: Control) -> None:
    import nats

    nc = await nats.connect(NATS_URL)
    js = nc.jetstream()
    while not ctl.go():
        if system == "nats":
            await nc.publish(topic, payload(WARM))
            await nc.flush()
        else:
            await js.publish(topic, payload(WARM), stream=JS_STREAM)
        await asyncio.sleep(0.02)
    start = time.monotonic_ns()
    wall_start = time.time()
    cpu_start = time.process_time()
    if opts.phase == "thr":
        for seq in range(opts.events):
            if system == "nats":
                await nc.publish(topic, payload(seq))
            else:
                await js.publish_async(topic, payload(seq), wait_stall=30, stream=JS_STREAM)
        if system == "jetstream":
            await js.publish_async_completed()
        await nc.flush()
    else:
        gap = 1.0 / opts.rate
        due = time.monotonic()
        for seq in range(opts.events):
            now = time.monotonic()
            if due > now:
                await asyncio.sleep(due - now)
            if system == "nats":
                await nc.publish(topic, payload(seq))
                await nc.flush()
            else:
                await js.publish(topic, payload(seq), stream=JS_STREAM)
            due = max(due + gap, time.monotonic() - gap)
    ctl.report.send_json(
        {
            "kind": "published",
            "start_ns": start,
            "wall_start": wall_start,
            "end_ns": time.monotonic_ns(),
            "cpu_s": time.process_time(),
            "phase_cpu_s": time.process_time() - cpu_start,
        }
    )
    await nc.close()


# ---------------------------------------------------------------- harness


def start_emq(servers: ServerSet) -> dict[str, str]:
    """A broker on private loopback ports, its journal (and event store) in a temp dir."""
    urls = {
        name: f"tcp://127.0.0.1:{free_port()}"
        for name in (
            "EMQ_FRONTEND_BIND",
            "EMQ_BACKEND_BIND",
            "EMQ_MONITOR_BIND",
            "EMQ_BUS_SNAPSHOT_BIND",
            "EMQ_BUS_PUBLISH_BIND",
            "EMQ_BUS_COLLECT_BIND",
            "EMQ_BUS_BATCH_BIND",
        )
    }
    journal = os.path.join(tempfile.mkdtemp(prefix="emq-topics-bench-"), "journal.sqlite3")
    env = base_env(
        DJANGO_SETTINGS_MODULE="project.settings",
        EMQ_BROKER_URL=urls["EMQ_FRONTEND_BIND"],
        EMQ_WORKER_URL=urls["EMQ_BACKEND_BIND"],
        EMQ_MONITOR_URL=urls["EMQ_MONITOR_BIND"],
        EMQ_JOURNAL_PATH=journal,
        EMQ_RECORDER="",
        EMQ_MDP_BIND="",
        EMQ_PZQ_RECEIVE_BIND="",
        EMQ_PZQ_SEND_BIND="",
        EMQ_PZQ_MONITOR_BIND="",
        EMQ_MC0_BIND="",
        **urls,
    )
    env.pop("EMQ_TRACE_DIR", None)
    servers.start(
        "emq-broker", "broker", [PYTHON, os.path.join(REPO, "manage.py"), "emq_broker"], env
    )
    from emq_django.monitor_client import query

    deadline = time.monotonic() + 60
    while True:
        try:
            query(env["EMQ_MONITOR_BIND"], b"MONITOR", timeout=1.0)
            return env
        except Exception:  # noqa: BLE001  (not up yet)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


async def _reset_jetstream() -> None:
    import nats
    from nats.js.api import StorageType, StreamConfig

    nc = await nats.connect(NATS_URL)
    js = nc.jetstream()
    try:
        await js.delete_stream(JS_STREAM)
    except Exception:  # noqa: BLE001  (not there yet)
        pass
    await js.add_stream(
        StreamConfig(name=JS_STREAM, subjects=["benchjs.>"], storage=StorageType.FILE)
    )
    await nc.close()


def loop_stalls(env: dict[str, str], since: float) -> dict[str, Any]:
    """The broker's slow loop turns (``broker/turns.py``) since the phase began:
    how many, and the slowest few with what they did."""
    from emq_django.monitor_client import query

    try:
        doc = json.loads(query(env["EMQ_MONITOR_BIND"], b"MONITOR JSON", timeout=10.0))
    except Exception as exc:  # noqa: BLE001  (a figure, not the result)
        return {"error": str(exc)}
    turns = [t for t in doc.get("loop", {}).get("recent", []) if t["at"] >= since]
    return {
        "slow_turns": len(turns),
        "slow_ms": round(sum(t["ms"] for t in turns), 1),
        "slowest": sorted(turns, key=lambda t: -t["ms"])[:5],
    }


def peer_pids(system: str) -> list[int]:
    """The peer's server process (a system service: read only)."""
    from bench.procs import find_system_pids

    return find_system_pids("redis-server" if system == "redis" else "nats-server")


def server_cpu(server: list[Any]) -> float:
    """User+system CPU seconds so far of the broker (a Server) or a peer's PIDs."""
    import psutil

    total = 0.0
    for s in server:
        try:
            t = psutil.Process(s if isinstance(s, int) else s.pid).cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def start_profile(pid: int, path: str, wait: bool = True) -> subprocess.Popen[bytes]:
    """py-spy on a process (the broker, a publisher, a subscriber), sampling until
    SIGINT or the process' end; folded stacks to ``path``."""
    spy = os.path.join(os.path.dirname(PYTHON), "py-spy")
    argv = [spy, "record", "-p", str(pid), "-f", "raw", "-o", path, "-r", "200", "--nonblocking"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if wait:
        time.sleep(1.0)  # attached
    return proc


def profile_top(path: str, n: int = 25) -> str:
    """The functions the broker spent its samples in: self and inclusive shares."""
    from collections import Counter

    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            if not count.isdigit():
                continue
            k = int(count)
            # "func (file:line)" -> "func (file)": shares per function, not per line
            frames = [f.rsplit(":", 1)[0] + ")" if f.endswith(")") else f for f in stack.split(";")]
            samples += k
            own[frames[-1]] += k
            for frame in set(frames):
                total[frame] += k
    if not samples:
        return f"{path}: no samples"
    out = [f"{path}: {samples} samples; self %, inclusive %, function"]
    for frame, k in own.most_common(n):
        out.append(f"{100 * k / samples:5.1f} {100 * total[frame] / samples:5.1f}  {frame}")
    return "\n".join(out)


def one_phase(
    system: str, phase: str, opts: argparse.Namespace, env: dict[str, str], servers: ServerSet
) -> dict[str, Any]:
    import zmq

    n = opts.events if phase == "thr" else int(opts.rate * opts.latency_seconds)
    topic = ("benchjs." if system == "jetstream" else "bench.") + f"{phase}.{time.time_ns()}"
    if system == "jetstream":
        asyncio.run(_reset_jetstream())
    ctx = zmq.Context.instance()
    report = ctx.socket(zmq.PULL)
    report_url = f"tcp://127.0.0.1:{report.bind_to_random_port('tcp://127.0.0.1')}"
    ctl = ctx.socket(zmq.PUSH)
    ctl_url = f"tcp://127.0.0.1:{ctl.bind_to_random_port('tcp://127.0.0.1')}"
    me = [PYTHON, os.path.abspath(__file__)]
    common = ["--system", system, "--topic", topic, "--phase", phase, "--report", report_url]
    common += ["--events", str(n), "--rate", str(opts.rate)]
    started = len(servers.servers)
    spies: list[tuple[str, subprocess.Popen[bytes]]] = []
    try:
        tag = f"{system}-{phase}{opts.round_no}"
        subs = [
            servers.start(
                f"{tag}-sub{k}", "sub", [*me, "--role", "sub", "--id", str(k), *common], env
            )
            for k in range(opts.subscribers)
        ]
        pub = servers.start(
            f"{tag}-pub", "pub", [*me, "--role", "pub", "--ctl", ctl_url, *common], env
        )
        # --profile: the publisher and one subscriber too, each role on its own,
        # from the "go" on (their start-up is not what is measured)
        profiled = opts.profile and system.startswith("emq") and phase == opts.profile_phase
        warm: set[int] = set()
        done: dict[int, dict[str, Any]] = {}
        published: dict[str, Any] = {}
        deadline = time.monotonic() + 120 + n / 500
        go_sent = False
        while len(done) < opts.subscribers or not published:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{system} {phase}: no end (warm {len(warm)}, done {len(done)})")
            if not report.poll(1000):
                if not published and not pub.alive() and not report.poll(1000):
                    raise RuntimeError(f"{system} {phase}: the publisher died:\n{pub.log_tail()}")
                gone = [k for k, sub in enumerate(subs) if not sub.alive() and k not in done]
                if gone and published:  # a subscriber died without its report
                    time.sleep(3.0)
                    while report.poll(0):
                        msg = report.recv_json()
                        if msg["kind"] == "done":
                            done[msg["id"]] = msg
                    for k in gone:
                        if k not in done:
                            print(
                                f"{system} {phase}: subscriber {k} died:\n{subs[k].log_tail()}",
                                file=sys.stderr,
                            )
                            done[k] = {
                                "count": 0,
                                "last_ns": 0,
                                "lags": [],
                                "cpu_s": 0.0,
                                "died": 1,
                            }
                continue
            msg = report.recv_json()
            if msg["kind"] == "warm":
                warm.add(msg["id"])
            elif msg["kind"] == "done":
                done[msg["id"]] = msg
            elif msg["kind"] == "published":
                published = msg
            if not go_sent and len(warm) == opts.subscribers:
                if profiled:
                    for role, proc in (("pub", pub), ("sub0", subs[0])):
                        path = f"{opts.profile}.{phase}.{opts.round_no}.{system}.{role}"
                        spies.append((path, start_profile(proc.pid, path, wait=False)))
                    time.sleep(1.0)  # attached
                ctl.send(b"go")
                go_sent = True
    finally:
        for path, spy in spies:
            spy.send_signal(signal.SIGINT)  # the process is gone or ending: py-spy writes
            try:
                spy.wait(timeout=60)
            except subprocess.TimeoutExpired:
                spy.kill()  # by PID: one we started
            print(profile_top(path), flush=True)
        for server in servers.servers[started:]:
            try:
                server.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.popen.kill()  # by PID: one we started
                server.popen.wait(timeout=5)
        del servers.servers[started:]
        report.close(linger=0)
        ctl.close(linger=0)
    delivered = sum(d["count"] for d in done.values())
    end = max(d["last_ns"] for d in done.values())
    elapsed = (end - published["start_ns"]) / 1e9
    result: dict[str, Any] = {
        "wall_start": published["wall_start"],
        "events": n,
        "delivered": delivered,
        "missed": n * opts.subscribers - delivered,
        "elapsed_s": round(elapsed, 3),
        "publish_s": round((published["end_ns"] - published["start_ns"]) / 1e9, 3),
    }
    # CPU per event, whole processes (start-up and warm-up included, the same for all)
    result["sub_cpu_us_per_event"] = round(
        sum(d["cpu_s"] for d in done.values()) / max(delivered, 1) * 1e6, 1
    )
    result["pub_cpu_us_per_event"] = round(published["cpu_s"] / n * 1e6, 1)
    # the same from the first event on (start-up and warm-up left out)
    result["sub_phase_cpu_us_per_event"] = round(
        sum(d.get("phase_cpu_s", 0.0) for d in done.values()) / max(delivered, 1) * 1e6, 1
    )
    if "phase_cpu_s" in published:
        result["pub_phase_cpu_us_per_event"] = round(published["phase_cpu_s"] / n * 1e6, 1)
    for key in ("gaps", "syncs", "from_snapshot", "died"):  # emq's client figures; deaths
        if any(key in d for d in done.values()):
            result[key] = sum(d.get(key, 0) for d in done.values())
    if result["missed"]:
        # a failed round: it is in the JSON, but never the table's best
        result["failed"] = f"missed {result['missed']} events"
        result["counts"] = [done[k]["count"] for k in sorted(done)]
    if phase == "thr":
        result["events_per_s"] = round(delivered / opts.subscribers / elapsed, 1)
    else:
        lags = sorted(lag / 1e6 for d in done.values() for lag in d["lags"])
        q = statistics.quantiles(lags, n=100, method="inclusive")
        result.update(
            p50_ms=round(statistics.median(lags), 3),
            p99_ms=round(q[98], 3),
            max_ms=round(lags[-1], 3),
        )
        # where the tail comes from: each subscriber's p99, and the events late
        # (LATE_MS or more) at most subscribers (held before the fan-out: the
        # publisher, the server) or at one or two (a subscriber's own wait)
        per_sub = [d["lags"] for _, d in sorted(done.items()) if len(d["lags"]) >= 2]
        result["sub_p99_ms"] = [
            round(statistics.quantiles(x, n=100, method="inclusive")[98] / 1e6, 1) for x in per_sub
        ]
        if per_sub and all(len(x) == len(per_sub[0]) for x in per_sub):
            cut = LATE_MS * 1e6
            late = [sum(1 for x in per_sub if x[i] >= cut) for i in range(len(per_sub[0]))]
            result["late_at_most_subs"] = sum(1 for k in late if k > len(per_sub) // 2)
            result["late_at_few_subs"] = sum(1 for k in late if 0 < k <= 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--subscribers", type=int, default=10)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--latency-seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", default=",".join(SYSTEMS))
    parser.add_argument("--json", default="")
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument(
        "--profile",
        default="",
        help="py-spy the broker in emq's --profile-phase phases; collapsed stacks to this path",
    )
    parser.add_argument(
        "--profile-phase", default="thr", choices=("thr", "lat"), help="the phase --profile samples"
    )
    # a subscriber's or the publisher's process
    parser.add_argument("--role", choices=("sub", "pub"), help=argparse.SUPPRESS)
    parser.add_argument("--system", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    parser.add_argument("--report", help=argparse.SUPPRESS)
    parser.add_argument("--ctl", help=argparse.SUPPRESS)
    parser.add_argument("--id", type=int, default=0, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.role:
        import gc

        import zmq

        # a context of its own, terminated at the end: that waits until the report
        # has left (a process exiting with only the socket closed could lose it,
        # and the harness then waited for a subscriber that had finished)
        report_ctx = zmq.Context()
        report = report_ctx.socket(zmq.PUSH)
        report.connect(opts.report)
        # the same for every system: each client's start-up objects (its imports,
        # Django's for emq) out of the collector's way; a full collection with
        # Django loaded takes tens of ms
        if opts.system.startswith("emq"):
            import django

            django.setup()
            import emq_django  # noqa: F401
        elif opts.system == "redis":
            import redis  # noqa: F401
        else:
            import nats  # noqa: F401
        gc.collect()
        gc.freeze()
        if opts.role == "sub":
            tally = Tally(opts.events, report, opts.id, opts.phase == "lat")
            run_subscriber(opts.system, opts.topic, tally, dict(os.environ))
        else:
            run_publisher(opts.system, opts.topic, opts, Control(opts.ctl, report))
        report.close(linger=5000)
        report_ctx.term()
        return

    systems = [s for s in opts.only.split(",") if s]
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown systems: {', '.join(sorted(unknown))}")
    log_dir = tempfile.mkdtemp(prefix="emq-topics-bench-logs-")
    servers = ServerSet(log_dir)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {
        s: {"thr": [], "lat": []} for s in systems
    }
    loads = []
    failures: list[str] = []
    try:
        env = base_env()
        if any(s.startswith("emq") for s in systems):
            env = start_emq(servers)
        broker = list(servers.servers)
        for r in range(opts.rounds):
            order = systems if r % 2 == 0 else systems[::-1]  # alternating
            for phase in ("thr", "lat"):
                for system in order:
                    spy = None
                    prof = opts.profile + f".{phase}.{r + 1}"
                    if opts.profile and system.startswith("emq") and phase == opts.profile_phase:
                        spy = start_profile(broker[0].pid, prof)
                    server = broker if system.startswith("emq") else peer_pids(system)
                    cpu0 = server_cpu(server)
                    opts.round_no = r + 1
                    try:
                        res = one_phase(system, phase, opts, env, servers)
                    except RuntimeError as exc:
                        if system.startswith("emq"):
                            raise
                        # a peer's phase that does not end: noted, the run goes on
                        print(f"round {r + 1} {system:9} {phase}: FAILED {exc}", flush=True)
                        failures.append(f"round {r + 1} {system} {phase}: {exc}")
                        continue
                    cpu = server_cpu(server) - cpu0
                    if system.startswith("emq"):
                        res["broker_loop"] = loop_stalls(env, res["wall_start"])
                    res["server_cpu_s"] = round(cpu, 3)
                    res["server_cpu_us_per_event"] = round(cpu / res["events"] * 1e6, 1)
                    if spy is not None:
                        spy.send_signal(signal.SIGINT)  # py-spy writes what it has
                        spy.wait(timeout=60)
                        print(profile_top(prof), flush=True)
                    loads.append(os.getloadavg()[0])
                    res["load_average"] = round(loads[-1], 2)
                    results[system][phase].append(res)
                    verdict = f"FAILED ({res['failed']}) " if res.get("failed") else ""
                    print(f"round {r + 1} {system:9} {phase}: {verdict}{res}", flush=True)
            for server in broker:
                if not server.alive():
                    raise RuntimeError(f"{server.name} died:\n{server.log_tail()}")
    finally:
        servers.stop_all()
        if not opts.keep_logs:
            import shutil

            shutil.rmtree(log_dir, ignore_errors=True)
        else:
            print(f"logs in {log_dir}")
    summary = summarise(results, opts)
    print_table(summary, loads)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(
                {
                    "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                    "cpus": os.cpu_count(),
                    "load_average": [round(x, 2) for x in loads],
                    "options": {k: v for k, v in vars(opts).items() if v is not None},
                    "summary": summary,
                    "failures": failures,
                    "rounds": results,
                },
                f,
                indent=1,
            )


def summarise(results: dict[str, dict[str, list[dict[str, Any]]]], opts: Any) -> dict[str, Any]:
    """Per system: the best round's events/s (least disturbed by other load) among
    the rounds that missed no event, and the median of the rounds' p50/p99; every
    round is in the JSON. A round with misses is failed: it is never the best
    (``failed_rounds`` counts them, in both phases)."""
    out: dict[str, Any] = {}
    for system, phases in results.items():
        thr = phases["thr"]
        lat = phases["lat"]
        clean = [r for r in thr if not r.get("failed")]
        out[system] = {
            "events_per_s": max(r["events_per_s"] for r in clean) if clean else None,
            "events_per_s_rounds": [r["events_per_s"] for r in thr],
            "failed_rounds": sum(1 for r in thr + lat if r.get("failed")),
            "missed": sum(r["missed"] for r in thr),
            "p50_ms": statistics.median(r["p50_ms"] for r in lat) if lat else None,
            "p99_ms": statistics.median(r["p99_ms"] for r in lat) if lat else None,
            "p99_ms_rounds": [r["p99_ms"] for r in lat],
            # CPU µs per event in the throughput phase, median of the rounds: the
            # server's, the publisher's and one subscriber's (per delivery), from
            # the first event on
            "thr_cpu_us": {
                who: statistics.median(r[key] for r in thr) if thr else None
                for who, key in (
                    ("server", "server_cpu_us_per_event"),
                    ("pub", "pub_phase_cpu_us_per_event"),
                    ("sub", "sub_phase_cpu_us_per_event"),
                )
            },
        }
    return out


def print_table(summary: dict[str, Any], loads: list[float]) -> None:
    print()
    print(
        f"{'system':10} {'events/s':>10} {'rounds':>22} {'missed':>7} {'failed':>6} "
        f"{'p50 ms':>8} {'p99 ms':>8}   CPU us/event (thr): server pub sub"
    )
    for system, s in summary.items():
        if s["events_per_s"] is None or s["p99_ms"] is None:
            print(f"{system:10} (every round failed or a phase did not end: see the rounds)")
            continue
        rounds = "/".join(f"{x:.0f}" for x in s["events_per_s_rounds"])
        cpu = s["thr_cpu_us"]
        print(
            f"{system:10} {s['events_per_s']:>10.0f} {rounds:>22} {s['missed']:>7} "
            f"{s['failed_rounds']:>6} "
            f"{s['p50_ms']:>8.3f} {s['p99_ms']:>8.3f}   "
            f"{cpu['server']:>6.1f} {cpu['pub']:>6.1f} {cpu['sub']:>6.1f}"
        )
    if "emq" in summary and "redis" in summary:
        ours, theirs = summary["emq"]["events_per_s"], summary["redis"]["events_per_s"]
        if not ours or not theirs:
            print("emq / redis delivered events/s: no clean round of one of them")
        else:
            print(
                f"emq / redis delivered events/s: {ours:.0f} / {theirs:.0f} = {ours / theirs:.2f}x"
            )
    print(
        f"load average during the run: {min(loads):.1f}..{max(loads):.1f} on {os.cpu_count()} CPUs"
    )


if __name__ == "__main__":
    main()
