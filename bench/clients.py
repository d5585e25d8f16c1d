"""The producer side of each system, run as its own process by run.py.

    python -m bench.clients SYSTEM --tasks N --results-tasks R --latency-tasks M
                            --sink CONTROL_URL --pid ROLE:PID ...

Prints one JSON document on its last stdout line. Measuring from inside the
producer keeps its own CPU (all threads) exact (time.process_time(), not /proc's
10 ms ticks), and the server trees are
sampled at the same instants as each phase starts and ends. Every send is the
library's own call for one job; completion of no-op jobs is counted by the
harness's sink (bench/sink.py), which every no-op task PUSHes to.
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
import zmq

from bench.procs import cpu_delta, tree_cpu

RESULT_TIMEOUT = 30.0


class Adapter(Protocol):
    def send_noop(self) -> None: ...
    def flush(self) -> None: ...
    def send_echo(self, i: int) -> Any: ...
    def get_result(self, handle: Any) -> Any: ...
    def close(self) -> None: ...
    def diagnose(self) -> str: ...


class _Base:
    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def diagnose(self) -> str:
        return ""


# ------------------------------------------------------------------ adapters


class CeleryAdapter(_Base):
    def __init__(self, opts: argparse.Namespace) -> None:
        from bench import celery_app

        self.m = celery_app

    def send_noop(self) -> None:
        self.m.noop.delay()

    def flush(self) -> None:
        # No publisher confirms (Celery's default): one synchronous AMQP call on
        # the same channel returns after RabbitMQ has handled every publish before it.
        with self.m.app.producer_or_acquire() as producer:
            producer.channel.queue_declare(queue=self.m.QUEUE, passive=True)

    def send_echo(self, i: int) -> Any:
        return self.m.echo.delay(i)

    def get_result(self, handle: Any) -> Any:
        return handle.get(timeout=RESULT_TIMEOUT)


class DramatiqAdapter(_Base):
    def __init__(self, opts: argparse.Namespace) -> None:
        from bench import dramatiq_app

        self.m = dramatiq_app

    def send_noop(self) -> None:
        self.m.noop.send()

    def flush(self) -> None:
        # confirm_delivery is off (Dramatiq's default): same synchronous call as Celery.
        self.m.broker.channel.queue_declare(queue=self.m.QUEUE, passive=True)

    def send_echo(self, i: int) -> Any:
        return self.m.echo.send(i)

    def get_result(self, handle: Any) -> Any:
        return handle.get_result(block=True, timeout=int(RESULT_TIMEOUT * 1000))

    def close(self) -> None:
        self.m.broker.close()


class HueyAdapter(_Base):
    def __init__(self, opts: argparse.Namespace) -> None:
        from bench import huey_app

        self.m = huey_app

    def send_noop(self) -> None:
        self.m.noop()

    def send_echo(self, i: int) -> Any:
        return self.m.echo(i)

    def get_result(self, handle: Any) -> Any:
        return handle.get(blocking=True, timeout=RESULT_TIMEOUT)


class RqAdapter(_Base):
    def __init__(self, opts: argparse.Namespace) -> None:
        from redis import Redis
        from rq import Queue

        from bench import rq_app

        self.m = rq_app
        self.q = Queue(rq_app.QUEUE, connection=Redis.from_url(rq_app.REDIS_URL))

    def send_noop(self) -> None:
        # result_ttl=0: no result kept, as Celery's ignore_result and emq's reply=False
        self.q.enqueue(self.m.noop, result_ttl=0)

    def send_echo(self, i: int) -> Any:
        return self.q.enqueue(self.m.echo, i)

    def get_result(self, handle: Any) -> Any:
        result = handle.latest_result(timeout=int(RESULT_TIMEOUT))
        if result is None or result.type != result.Type.SUCCESSFUL:
            raise RuntimeError(f"rq job {handle.id}: no successful result ({result!r})")
        return result.return_value


class ZmqAdapter(_Base):
    """The raw reference: one DEALER; an empty body is a no-op job."""

    def __init__(self, opts: argparse.Namespace) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(opts.endpoint)

    def send_noop(self) -> None:
        self.sock.send(b"", zmq.NOBLOCK)

    def send_echo(self, i: int) -> Any:
        self.sock.send(b"%d" % i, zmq.NOBLOCK)
        return None

    def get_result(self, handle: Any) -> Any:
        # Replies from 2 workers may come in any order: the next one is "a" result;
        # the results phase checks the set of values.
        if not self.sock.poll(int(RESULT_TIMEOUT * 1000)):
            raise TimeoutError("zmq: no reply")
        return int(self.sock.recv())

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


class EmqAdapter(_Base):
    def __init__(self, opts: argparse.Namespace) -> None:
        import django

        django.setup()
        import emq_django as emq
        from bench import emq_bench_tasks

        self.emq = emq
        self.t = emq_bench_tasks
        # BENCH_EMQ_GUARANTEE: "" plain jobs; "each": guaranteed, delay() waits for each
        # ACK; "batch": guaranteed, Task.map() of 500 at a time waits for all their ACKs
        self.guarantee = os.environ.get("BENCH_EMQ_GUARANTEE", "")
        self._batched = 0

    def send_noop(self) -> None:
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

    def send_echo(self, i: int) -> Any:
        return self.t.echo.delay(i)

    def get_result(self, handle: Any) -> Any:
        return handle.get(timeout=RESULT_TIMEOUT)


ADAPTERS: dict[str, Callable[[argparse.Namespace], Adapter]] = {
    "emq": EmqAdapter,
    "celery": CeleryAdapter,
    "dramatiq": DramatiqAdapter,
    "huey": HueyAdapter,
    "rq": RqAdapter,
    "zmq": ZmqAdapter,
}


# ------------------------------------------------------------------ completion


STALL_LIMIT = 30.0


class Sink:
    """The producer's side of bench/sink.py: how many no-op tasks have run."""

    def __init__(self, control_url: str) -> None:
        self.ctx = zmq.Context()
        self.req = self.ctx.socket(zmq.REQ)
        self.req.setsockopt(zmq.LINGER, 0)
        self.req.connect(control_url)
        self.url = control_url

    def wait(self, target: int, ms: int) -> int:
        """The count once it reaches ``target``, or after ``ms`` whatever it is."""
        self.req.send(b"WAIT %d %d" % (target, ms))
        if not self.req.poll(ms + 5000):
            raise RuntimeError(f"the completion sink at {self.url} did not answer")
        return int(self.req.recv())

    def close(self) -> None:
        self.req.close()
        self.ctx.term()


def wait_done(sink: Sink, a: Adapter, target: int, timeout: float) -> None:
    """Block until ``target``; raise TimeoutError on timeout or 30 s without progress."""
    deadline = time.monotonic() + timeout
    last, last_change = -1, time.monotonic()
    while (done := sink.wait(target, 1000)) < target:
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


# ------------------------------------------------------------------ phases


class CpuWindow:
    """CPU of every role's process trees, and of the whole machine, over a phase."""

    def __init__(self, roles: dict[str, list[int]]) -> None:
        self.groups = {"producer": [os.getpid()], **roles}

    def __enter__(self) -> CpuWindow:
        self.before = {g: tree_cpu(p) for g, p in self.groups.items()}
        self.machine0 = _machine_busy()
        # this process's own CPU (every thread, libzmq's and the client's included)
        # from the kernel's nanosecond clock: /proc's figures (tree_cpu) come in
        # 10 ms ticks, which is a third of a producer's whole CPU over 10,000 jobs
        self.own0 = time.process_time()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.elapsed = time.perf_counter() - self.t0
        own = time.process_time() - self.own0
        machine1 = _machine_busy()
        self.after = {g: tree_cpu(p) for g, p in self.groups.items()}
        self.cpu = {g: cpu_delta(self.before[g], self.after[g]) for g in self.groups}
        self.cpu["producer"] = own  # (the producer starts no process of its own)
        ours = sum(self.cpu.values())
        # Busy CPU on the whole machine that none of our processes used: other
        # people's load, which slows every system down. Ideally near zero.
        self.other = max(0.0, machine1 - self.machine0 - ours)

    def report(self, n: int, prefix: str) -> dict[str, Any]:
        harness = self.cpu.get("harness", 0.0)
        by_role = {g: v / n * 1e6 for g, v in self.cpu.items() if g != "harness"}
        return {
            f"{prefix}_s": self.elapsed,
            f"{prefix}_per_s": n / self.elapsed,
            f"{prefix}_cpu_us_per_task": sum(by_role.values()),
            f"{prefix}_cpu_us_per_task_by_role": by_role,
            f"{prefix}_harness_cpu_us_per_task": harness / n * 1e6,
            f"{prefix}_other_load_cores": self.other / self.elapsed,
        }


def warm_up(sink: Sink, a: Adapter, n: int, echoes: int, timeout: float) -> None:
    for _ in range(n):
        a.send_noop()
    a.flush()
    wait_done(sink, a, n, timeout)
    for i in range(echoes):
        a.get_result(a.send_echo(i))


def drain(sink: Sink, a: Adapter, n: int, base: int, roles: dict[str, list[int]]) -> dict[str, Any]:
    """Send n no-op jobs one by one, wait until the sink has counted them all."""
    with CpuWindow(roles) as w:
        for _ in range(n):
            a.send_noop()
        a.flush()
        t_enq = time.perf_counter()
        wait_done(sink, a, base + n, timeout=max(120.0, n / 50))
    out = w.report(n, "drain")
    out["enqueue_s"] = t_enq - w.t0
    out["enqueue_per_s"] = n / (t_enq - w.t0)
    if os.environ.get("BENCH_CPU_DETAIL"):
        _cpu_detail(os.environ["BENCH_CPU_DETAIL"], w, n)
    return out


def results(a: Adapter, n: int, roles: dict[str, list[int]]) -> dict[str, Any]:
    """Send n echo(i) jobs, then get every result through the library's result API."""
    with CpuWindow(roles) as w:
        handles = [a.send_echo(i) for i in range(n)]
        values = [a.get_result(h) for h in handles]
    if sorted(values) != list(range(n)):
        raise RuntimeError("results phase: the results are not the values sent")
    return w.report(n, "results")


def _cpu_detail(path: str, w: CpuWindow, n: int) -> None:
    """Append each process's CPU µs per task to ``path`` (BENCH_CPU_DETAIL=path):
    which process of a role the time went to (a job manager's children, say)."""
    with open(path, "a") as f:
        for group in w.groups:
            for key, seconds in w.after[group].items():
                try:
                    name = " ".join(psutil.Process(key[0]).cmdline())[-60:]
                except psutil.Error:
                    name = "?"
                used = (seconds - w.before[group].get(key, 0.0)) / n * 1e6
                f.write(f"{group} {key[0]} {used:.1f} {name}\n")
        f.write("--\n")


def _machine_busy() -> float:
    t = psutil.cpu_times()
    return (
        sum(t)
        - t.idle
        - getattr(t, "iowait", 0.0)
        - getattr(t, "guest", 0.0)
        - getattr(t, "guest_nice", 0.0)
    )


def percentile(sorted_samples: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list (p in 0..100)."""
    return sorted_samples[min(len(sorted_samples) - 1, int(p / 100 * len(sorted_samples)))]


def latency(a: Adapter, n: int, warmup: int) -> dict[str, Any]:
    for i in range(warmup):
        a.get_result(a.send_echo(i))
    samples = []
    for i in range(n):
        t = time.perf_counter()
        value = a.get_result(a.send_echo(i))
        samples.append(time.perf_counter() - t)
        if value != i:
            raise RuntimeError(f"round trip {i}: got {value!r}")
    samples.sort()
    return {
        "rtt_p50_ms": percentile(samples, 50) * 1e3,
        "rtt_p90_ms": percentile(samples, 90) * 1e3,
        "rtt_p99_ms": percentile(samples, 99) * 1e3,
        "rtt_max_ms": samples[-1] * 1e3,
        "rtt_mean_ms": sum(samples) / len(samples) * 1e3,
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("system", choices=sorted(ADAPTERS))
    ap.add_argument("--tasks", type=int, default=10000)
    ap.add_argument("--results-tasks", type=int, default=10000)
    ap.add_argument("--latency-tasks", type=int, default=1000)
    ap.add_argument("--latency-warmup", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--endpoint", default="")
    ap.add_argument("--sink", required=True, help="the completion sink's control URL")
    ap.add_argument("--startup-timeout", type=float, default=60.0)
    ap.add_argument("--pid", action="append", default=[], help="ROLE:PID of a server process tree")
    opts = ap.parse_args(argv)
    roles: dict[str, list[int]] = {}
    for item in opts.pid:
        role, pid = item.split(":")
        roles.setdefault(role, []).append(int(pid))

    sink = Sink(opts.sink)
    a = ADAPTERS[opts.system](opts)
    try:
        warm_up(sink, a, opts.warmup, 20, opts.startup_timeout)
        result: dict[str, Any] = {"system": opts.system}
        result.update(drain(sink, a, opts.tasks, opts.warmup, roles))
        if opts.results_tasks:
            result.update(results(a, opts.results_tasks, roles))
        if opts.latency_tasks:
            result.update(latency(a, opts.latency_tasks, opts.latency_warmup))
        result["producer_rss_mb"] = psutil.Process().memory_info().rss / 2**20
    finally:
        a.close()
        sink.close()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
