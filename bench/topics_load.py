"""Topics under hostile load (issue 30): two measurements on the real processes.

    python bench/topics_load.py snapshots [--events 1000000] [--clients 20]
    python bench/topics_load.py publish-pause [--events 500000] [--pause 8]

- ``snapshots``: a broker (``manage.py emq_broker``, journal on) keeping
  ``--events`` events, a job manager, and a process running ``echo.delay(1).get()``
  in a loop. Then ``--clients`` DEALERs each send ``SYNCSTART '' 0`` (every kept
  event) and close at once (``--hold S``: stay connected S seconds, reading
  nothing, first). Reported: the round trips' failures, max and p99
  during the whole run, the snapshots the broker abandoned, and the broker's RSS
  after the fill, at its peak and after the replays ended.
- ``publish-pause``: a broker, one ``emq.subscribe`` process reading everything,
  and two processes each ``publish_many`` ``--events`` events (1,000 a call) and
  exit; the broker is paused (SIGSTOP) ``--pause`` seconds once it has numbered
  a quarter of them. Reported: what each publisher said (exit code, ``PublishUnconfirmed``
  or the count logged at exit), the events the broker numbered and the events
  the subscriber got.

Results in bench/README.md ("Topics under hostile load").
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.procs import REPO, ServerSet, base_env, free_ports  # noqa: E402

PYTHON = sys.executable
MANAGE = [PYTHON, os.path.join(REPO, "manage.py")]

ROUND_TRIPS = """
import json, time, django
django.setup()
from bench.emq_bench_tasks import echo
stop = time.monotonic() + float({seconds})
rtts, failures = [], []
while time.monotonic() < stop:
    t = time.perf_counter()
    try:
        echo.delay(1).get(timeout=10)
        rtts.append(time.perf_counter() - t)
    except Exception as exc:
        failures.append(f"{{type(exc).__name__}}: {{exc}}")
print(json.dumps({{"rtts": rtts, "failures": failures}}))
"""

PUBLISHER = """
import django, emq_django as emq
django.setup()
n = int({n})
for start in range(0, n, 1000):
    emq.publish_many("/load/{name}", range(start, min(n, start + 1000)))
print("sent", n, flush=True)
"""

SUBSCRIBER = """
import json, django, emq_django as emq
django.setup()
want, got, seen, expired = int({n}), 0, set(), 0
with emq.subscribe("/load/", since=0) as sub:
    while got < want:
        try:
            event = sub.next(timeout=60)
        except emq.EventsExpired as exc:
            expired += exc.last - exc.first + 1
            continue
        if event is None:
            break
        got += 1
        seen.add(event.seq)
print(json.dumps({{"got": got, "distinct": len(seen), "expired": expired}}))
"""


def broker_env(work: str, **extra: str) -> dict[str, str]:
    names = ("FRONTEND", "BACKEND", "MONITOR", "BUS_SNAPSHOT", "BUS_PUBLISH", "BUS_COLLECT")
    urls = {
        f"EMQ_{n}_BIND": f"tcp://127.0.0.1:{p}" for n, p in zip(names, free_ports(6), strict=True)
    }
    env = base_env(
        DJANGO_SETTINGS_MODULE="project.settings",
        EMQ_BROKER_URL=urls["EMQ_FRONTEND_BIND"],
        EMQ_WORKER_URL=urls["EMQ_BACKEND_BIND"],
        EMQ_MONITOR_URL=urls["EMQ_MONITOR_BIND"],
        EMQ_JOURNAL_PATH=os.path.join(work, "journal.sqlite3"),
        EMQ_IMPORTS="bench.emq_bench_tasks",
        EMQ_RECORDER="",
        EMQ_MDP_BIND="",
        EMQ_PZQ_RECEIVE_BIND="",
        EMQ_PZQ_SEND_BIND="",
        EMQ_PZQ_MONITOR_BIND="",
        EMQ_MC0_BIND="",
        **urls,
        **extra,
    )
    env.pop("EMQ_TRACE_DIR", None)
    return env


def status(env: dict[str, str]) -> dict[str, Any]:
    from emq_django.monitor_client import status as monitor_status

    return monitor_status(env["EMQ_MONITOR_URL"], timeout=10.0)


def wait_up(env: dict[str, str]) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            status(env)
            return
        except Exception:  # noqa: BLE001  (not up yet)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def use_env(env: dict[str, str]) -> None:
    """This process publishes and asks the monitor with ``env``'s addresses."""
    os.environ.update({k: v for k, v in env.items() if k.startswith(("EMQ_", "DJANGO_"))})
    import django

    django.setup()
    from emq_django.conf import reset_cached_settings

    reset_cached_settings()


def fill(env: dict[str, str], n: int) -> None:
    import emq_django as emq

    for start in range(0, n, 10_000):
        emq.publish_many("/kept/x", [b"x" * 100] * min(10_000, n - start))
    emq.wait_published(timeout=300)
    while status(env)["topics"]["last_seq"] < n:
        time.sleep(0.2)


def rss_mb(pid: int) -> float:
    return round(psutil.Process(pid).memory_info().rss / 1e6, 1)


def snapshots(opts: argparse.Namespace, servers: ServerSet, work: str) -> dict[str, Any]:
    import zmq

    retention = json.dumps({"": {"max_count": opts.events}})
    env = broker_env(work, EMQ_TOPIC_RETENTION=retention)
    broker = servers.start("broker", "broker", [*MANAGE, "emq_broker"], env)
    servers.start(
        "jobmanager",
        "workers",
        [*MANAGE, "emq_jobmanager", "--queues", "bench:10", "--concurrency", "2"],
        env,
    )
    wait_up(env)
    use_env(env)
    started = time.monotonic()
    fill(env, opts.events)
    filled_s = time.monotonic() - started
    time.sleep(2)  # the journal's checkpoint after the fill settles
    rss_filled = rss_mb(broker.pid)
    loop = subprocess.Popen(
        [PYTHON, "-c", ROUND_TRIPS.format(seconds=opts.seconds)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(2)  # round trips before the snapshots
    ctx = zmq.Context()
    socks = []
    for _ in range(opts.clients):
        sock = ctx.socket(zmq.DEALER)
        sock.connect(env["EMQ_BUS_SNAPSHOT_BIND"])
        sock.send_multipart([b"SYNCSTART", b"", b"0"])
        socks.append(sock)
    peak = rss_filled
    asked = time.monotonic()
    while time.monotonic() < asked + opts.hold:  # connected, reading nothing
        peak = max(peak, rss_mb(broker.pid))
        time.sleep(0.1)
    for sock in socks:
        sock.close(linger=2000)  # the request leaves; nothing is read
    while True:
        peak = max(peak, rss_mb(broker.pid))
        figures = status(env)["topics"]["ports"]["eventbus"]
        if figures["syncs"] >= opts.clients and figures["replays"] == 0:
            break
        time.sleep(0.1)
    replays_s = time.monotonic() - asked
    out, _ = loop.communicate(timeout=opts.seconds + 60)
    ctx.term()
    result = json.loads(out.strip().splitlines()[-1])
    rtts = sorted(result["rtts"])
    figures = status(env)["topics"]["ports"]["eventbus"]
    return {
        "events_kept": opts.events,
        "fill_s": round(filled_s, 1),
        "clients": opts.clients,
        "hold_s": opts.hold,
        "round_trips": len(rtts),
        "failures": result["failures"],
        "rtt_max_ms": round(rtts[-1] * 1000, 1),
        "rtt_p99_ms": round(rtts[int(len(rtts) * 0.99)] * 1000, 1),
        "rtt_p50_ms": round(statistics.median(rtts) * 1000, 2),
        "replays_ended_s": round(replays_s, 2),
        "replays_abandoned": figures["replays_abandoned"],
        "synced_events": figures["synced_events"],
        "rss_mb_filled": rss_filled,
        "rss_mb_peak": peak,
        "rss_mb_after": rss_mb(broker.pid),
    }


def publish_pause(opts: argparse.Namespace, servers: ServerSet, work: str) -> dict[str, Any]:
    total = 2 * opts.events
    retention = json.dumps({"": {"max_count": total}})
    env = broker_env(work, EMQ_TOPIC_RETENTION=retention)
    broker = servers.start("broker", "broker", [*MANAGE, "emq_broker"], env)
    wait_up(env)
    use_env(env)
    sub = subprocess.Popen(
        [PYTHON, "-c", SUBSCRIBER.format(n=total)], cwd=REPO, env=env, stdout=subprocess.PIPE
    )
    time.sleep(3)  # subscribed
    pubs = [
        subprocess.Popen(
            [PYTHON, "-c", PUBLISHER.format(n=opts.events, name=name)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    while status(env)["topics"]["last_seq"] < total // 4:  # in the middle of it
        time.sleep(0.05)
    paused_at = status(env)["topics"]["last_seq"]
    os.kill(broker.pid, signal.SIGSTOP)
    time.sleep(opts.pause)
    os.kill(broker.pid, signal.SIGCONT)
    said = []
    for p in pubs:
        out, err = p.communicate(timeout=600)
        tail = [line for line in err.splitlines() if "confirm" in line][-3:]
        said.append({"exit": p.returncode, "stdout": out.strip(), "unconfirmed": tail})
    sub_out, _ = sub.communicate(timeout=600)
    return {
        "events_published": total,
        "pause_s": opts.pause,
        "paused_at_event": paused_at,
        "publishers": said,
        "broker_numbered": status(env)["topics"]["last_seq"],
        "subscriber": json.loads(sub_out.decode().strip().splitlines()[-1]),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=("snapshots", "publish-pause"))
    parser.add_argument("--events", type=int, default=0)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=20.0, help="the round-trip loop's")
    parser.add_argument("--pause", type=float, default=8.0)
    parser.add_argument(
        "--hold", type=float, default=0.0, help="seconds the snapshot clients stay, not reading"
    )
    opts = parser.parse_args()
    work = tempfile.mkdtemp(prefix="emq-topics-load-")
    servers = ServerSet(os.path.join(work, "logs"))
    try:
        if opts.scenario == "snapshots":
            opts.events = opts.events or 1_000_000
            result = snapshots(opts, servers, work)
        else:
            opts.events = opts.events or 500_000
            result = publish_pause(opts, servers, work)
    finally:
        servers.stop_all()
    result["load_avg"] = os.getloadavg()
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
