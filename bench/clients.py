"""The producer side of each system, run as its own process by run.py.

    python -m bench.clients SYSTEM --tasks N --latency-tasks M --pid ROLE:PID ...

Prints one JSON document on its last stdout line. Measuring from inside the
producer keeps its own CPU (all threads) exact, and the server trees are
sampled at the same instants as the drain starts and ends.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

import psutil

from bench.procs import Snapshot, cpu_delta, tree_cpu

POLL_INTERVAL = 0.02


class Adapter(Protocol):
    completion_method: str

    def enqueue_noop(self) -> None: ...
    def flush(self) -> None: ...
    def done(self) -> int: ...
    def roundtrip(self, i: int) -> None: ...
    def close(self) -> None: ...
    def diagnose(self) -> str: ...


class _NoDiagnosis:
    def diagnose(self) -> str:
        return ""


# ------------------------------------------------------------------ adapters


class CeleryAdapter(_NoDiagnosis):
    completion_method = (
        "each worker process counts finished no-op tasks in memory and a thread "
        "adds the increase to a Redis key every 5 ms; producer polls it every 20 ms"
    )

    def __init__(self, opts: argparse.Namespace) -> None:
        import redis

        from bench import celery_app

        self.m = celery_app
        self.redis = redis.Redis.from_url(
            os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
        )
        self.redis.delete(celery_app.DONE_KEY)

    def enqueue_noop(self) -> None:
        self.m.noop.delay()

    def flush(self) -> None:
        # No publisher confirms (Celery's default): one synchronous AMQP call on
        # the same channel returns after RabbitMQ has handled every publish before it.
        with self.m.app.producer_or_acquire() as producer:
            producer.channel.queue_declare(queue=self.m.QUEUE, passive=True)

    def done(self) -> int:
        from bench.donecount import read_done

        return read_done(self.redis, self.m.DONE_KEY)

    def roundtrip(self, i: int) -> None:
        assert self.m.echo.delay(i).get(timeout=10) == i

    def close(self) -> None:
        pass


class DramatiqAdapter(_NoDiagnosis):
    completion_method = CeleryAdapter.completion_method

    def __init__(self, opts: argparse.Namespace) -> None:
        import redis

        from bench import dramatiq_app

        self.m = dramatiq_app
        self.redis = redis.Redis.from_url(dramatiq_app.REDIS_URL)
        self.redis.delete(dramatiq_app.DONE_KEY)

    def enqueue_noop(self) -> None:
        self.m.noop.send()

    def flush(self) -> None:
        # confirm_delivery is off (Dramatiq's default): same synchronous call as Celery.
        self.m.broker.channel.queue_declare(queue=self.m.QUEUE, passive=True)

    def done(self) -> int:
        from bench.donecount import read_done

        return read_done(self.redis, self.m.DONE_KEY)

    def roundtrip(self, i: int) -> None:
        message = self.m.echo.send(i)
        assert message.get_result(block=True, timeout=10_000) == i

    def close(self) -> None:
        self.m.broker.close()


class ZmqAdapter(_NoDiagnosis):
    completion_method = "the producer counts the replies it has received"

    def __init__(self, opts: argparse.Namespace) -> None:
        import zmq

        self.zmq = zmq
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(opts.endpoint)
        self.replies = 0
        self.body = b"{}"

    def enqueue_noop(self) -> None:
        self.sock.send(self.body, self.zmq.NOBLOCK)

    def flush(self) -> None:
        pass  # nothing acknowledges a request in the raw reference

    def done(self) -> int:
        # Called in the poll loop: drain every reply that has arrived.
        sock, noblock = self.sock, self.zmq.NOBLOCK
        if sock.poll(int(POLL_INTERVAL * 1000)):
            while True:
                try:
                    sock.recv(noblock)
                except self.zmq.Again:
                    break
                self.replies += 1
        return self.replies

    def roundtrip(self, i: int) -> None:
        self.sock.send(b"%d" % i)
        assert self.sock.recv() == b"%d" % i
        self.replies += 1

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


class EmqAdapter:
    completion_method = (
        "broker monitor: 'MONITOR JSON' on a REQ socket every 20 ms until "
        "counters.succeeded + counters.failed has grown by N"
    )

    def __init__(self, opts: argparse.Namespace) -> None:
        import django
        import zmq

        django.setup()
        import emq_django as emq
        from bench import emq_bench_tasks

        self.emq = emq
        self.t = emq_bench_tasks
        self.zmq = zmq
        self.ctx = zmq.Context()
        self.monitor_url = opts.endpoint
        self.mon = self._monitor_socket()
        # BENCH_EMQ_GUARANTEE: "" plain jobs; "each": guaranteed, delay() waits for each
        # ACK; "batch": guaranteed, Task.map() of 500 at a time waits for all their ACKs
        self.guarantee = os.environ.get("BENCH_EMQ_GUARANTEE", "")
        self._batched = 0

    def _monitor_socket(self) -> Any:
        s = self.ctx.socket(self.zmq.REQ)
        s.setsockopt(self.zmq.LINGER, 0)
        s.connect(self.monitor_url)
        return s

    def enqueue_noop(self) -> None:
        if self.guarantee == "each":
            self.t.noop_guaranteed.delay()
        elif self.guarantee == "batch":
            self._batched += 1
            if self._batched == 500:
                self._send_batch()
        else:
            self.t.noop.delay()

    def _send_batch(self) -> None:
        self.t.noop_guaranteed.map([()] * self._batched)
        self._batched = 0

    def flush(self) -> None:
        if self._batched:
            self._send_batch()
        self.emq.client.get_client().flush(timeout=120)

    def _monitor(self) -> dict[str, Any]:
        self.mon.send(b"MONITOR JSON")
        if not self.mon.poll(5000):
            raise RuntimeError(f"emq monitor at {self.monitor_url} did not answer in 5 s")
        doc: dict[str, Any] = json.loads(self.mon.recv())
        return doc

    def diagnose(self) -> str:
        doc = self._monitor()
        keep = {k: doc.get(k) for k in ("counters", "queues", "job_managers", "in_flight")}
        return "; broker monitor: " + json.dumps(keep)

    def done(self) -> int:
        counters = self._monitor()["counters"]
        return int(counters.get("succeeded", 0)) + int(counters.get("failed", 0))

    def roundtrip(self, i: int) -> None:
        assert self.t.echo.delay(i).get(timeout=10) == i

    def close(self) -> None:
        self.mon.close()
        self.ctx.term()


ADAPTERS: dict[str, Callable[[argparse.Namespace], Adapter]] = {
    "celery": CeleryAdapter,
    "dramatiq": DramatiqAdapter,
    "zmq": ZmqAdapter,
    "emq": EmqAdapter,
}


# ------------------------------------------------------------------ phases


STALL_LIMIT = 30.0


def wait_done(a: Adapter, target: int, timeout: float) -> None:
    """Poll until ``target``; raise TimeoutError on timeout or 30 s without progress."""
    deadline = time.monotonic() + timeout
    last, last_change = -1, time.monotonic()
    while (done := a.done()) < target:
        now = time.monotonic()
        if done != last:
            last, last_change = done, now
        elif now - last_change > STALL_LIMIT:
            raise TimeoutError(
                f"stalled: {done} of {target} tasks finished, no progress for {STALL_LIMIT:.0f} s"
                f"{a.diagnose()}"
            )
        if now > deadline:
            raise TimeoutError(f"only {done} of {target} tasks finished after {timeout:.0f} s")
        if not isinstance(a, ZmqAdapter):  # ZmqAdapter.done() already waits in poll()
            time.sleep(POLL_INTERVAL)


def warm_up(a: Adapter, n: int, timeout: float) -> None:
    base = a.done()
    for _ in range(n):
        a.enqueue_noop()
    a.flush()
    wait_done(a, base + n, timeout)


def _cpu_detail(
    path: str,
    groups: dict[str, list[int]],
    before: dict[str, Snapshot],
    after: dict[str, Snapshot],
    n: int,
) -> None:
    """Append each process's CPU µs per task to ``path`` (BENCH_CPU_DETAIL=path):
    which process of a role the time went to (a job manager's children, say)."""
    with open(path, "a") as f:
        for group in groups:
            for key, seconds in after[group].items():
                try:
                    name = " ".join(psutil.Process(key[0]).cmdline())[-60:]
                except psutil.Error:
                    name = "?"
                used = (seconds - before[group].get(key, 0.0)) / n * 1e6
                f.write(f"{group} {key[0]} {used:.1f} {name}\n")
        f.write("--\n")


def drain(a: Adapter, n: int, roles: dict[str, list[int]]) -> dict[str, Any]:
    me = os.getpid()
    groups = {"producer": [me], **roles}
    base = a.done()
    cpu0 = {g: tree_cpu(p) for g, p in groups.items()}
    machine0 = _machine_busy()
    t0 = time.perf_counter()
    for _ in range(n):
        a.enqueue_noop()
    a.flush()
    t_enq = time.perf_counter()
    wait_done(a, base + n, timeout=max(120.0, n / 50))
    t_end = time.perf_counter()
    machine1 = _machine_busy()
    cpu1 = {g: tree_cpu(p) for g, p in groups.items()}
    cpu = {g: cpu_delta(cpu0[g], cpu1[g]) for g in groups}
    if os.environ.get("BENCH_CPU_DETAIL"):
        _cpu_detail(os.environ["BENCH_CPU_DETAIL"], groups, cpu0, cpu1, n)
    total = sum(cpu.values())
    # Busy CPU on the whole machine that none of our processes used: other
    # people's load, which slows every system down. Ideally near zero.
    other = max(0.0, machine1 - machine0 - total)
    return {
        "enqueue_s": t_enq - t0,
        "enqueue_per_s": n / (t_enq - t0),
        "drain_s": t_end - t0,
        "drain_per_s": n / (t_end - t0),
        "cpu_s": cpu,
        "cpu_us_per_task": total / n * 1e6,
        "cpu_us_per_task_by_role": {g: v / n * 1e6 for g, v in cpu.items()},
        "other_load_cpu_s": other,
        "other_load_cores": other / (t_end - t0),
    }


def _machine_busy() -> float:
    t = psutil.cpu_times()
    return (
        sum(t)
        - t.idle
        - getattr(t, "iowait", 0.0)
        - getattr(t, "guest", 0.0)
        - getattr(t, "guest_nice", 0.0)
    )


def latency(a: Adapter, n: int, warmup: int) -> dict[str, Any]:
    for i in range(warmup):
        a.roundtrip(i)
    samples = []
    for i in range(n):
        t = time.perf_counter()
        a.roundtrip(i)
        samples.append(time.perf_counter() - t)
    samples.sort()

    def pct(p: float) -> float:
        return samples[min(len(samples) - 1, int(p / 100 * len(samples)))] * 1e3

    return {
        "rtt_p50_ms": pct(50),
        "rtt_p90_ms": pct(90),
        "rtt_p99_ms": pct(99),
        "rtt_max_ms": samples[-1] * 1e3,
        "rtt_mean_ms": sum(samples) / len(samples) * 1e3,
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("system", choices=sorted(ADAPTERS))
    ap.add_argument("--tasks", type=int, default=20000)
    ap.add_argument("--latency-tasks", type=int, default=1000)
    ap.add_argument("--latency-warmup", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--endpoint", default="")
    ap.add_argument("--startup-timeout", type=float, default=60.0)
    ap.add_argument("--pid", action="append", default=[], help="ROLE:PID of a server process tree")
    opts = ap.parse_args(argv)
    roles: dict[str, list[int]] = {}
    for item in opts.pid:
        role, pid = item.split(":")
        roles.setdefault(role, []).append(int(pid))

    a = ADAPTERS[opts.system](opts)
    try:
        warm_up(a, opts.warmup, opts.startup_timeout)
        result: dict[str, Any] = {"system": opts.system, "completion": a.completion_method}
        result.update(drain(a, opts.tasks, roles))
        if opts.latency_tasks:
            result.update(latency(a, opts.latency_tasks, opts.latency_warmup))
        result["producer_rss_mb"] = psutil.Process().memory_info().rss / 2**20
    finally:
        a.close()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
