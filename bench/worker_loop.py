"""CPU per job of one worker process, ours beside the raw forwarder's, in one run.

    .venv/bin/python bench/worker_loop.py [--jobs 5000] [--rate 1000] [--pairs 2]
        [--only emq,zmq]

A ROUTER in this process plays the broker for one worker process: the real
``SlotWorker`` (forked as a job manager forks it, with its own DEALER and slot
table) or ``bench/zmq_ref.py worker``. It sends one no-op job per credit the
worker gave, at most ``--rate`` jobs a second (0: as fast as this process can),
and counts the worker's CPU per job from /proc, by thread (the Python thread and
libzmq's I/O threads). The no-op task sends the same completion PUSH in both
(``bench/donesignal.py``), to a PULL here.

Why: in the fair benchmark the workers' CPU per job depends on how jobs arrive.
A worker that waits for each job pays a wake-up (its own and its I/O threads')
per job; one that finds jobs queued does not. The raw forwarder is fast enough
to queue jobs at its workers, emq's producer and broker often are not, so the
ratio of the two mixes the worker's own cost with the arrival pattern. Here
both workers get the same arrivals. Runs alternate (``--pairs``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
os.environ["EMQ_RECORDER"] = ""  # the history recorder off, as in bench/run.py

import zmq  # noqa: E402

WARM_UP = 500
TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of ``pid``, by thread name (summed per name)."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        name = "python" if not name.startswith("ZMQ") else name.replace("ZMQbg/", "")
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / TICK
    return out


class Driver:
    """The broker's side: credit in, one job per credit out, completions counted."""

    def __init__(self, kind: str, ctx: zmq.Context[Any], done: zmq.Socket[bytes]) -> None:
        from emq_django.protocol import frames as F
        from emq_django.protocol.body import encode_run_body

        self.kind = kind
        self.done = done
        self.router = ctx.socket(zmq.ROUTER)
        self.router.sndhwm = self.router.rcvhwm = 0
        port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.url = f"tcp://127.0.0.1:{port}"
        self.credit = 0
        self.peer = b""
        self.sent = 0
        self.finished = 0
        self.job = F.encode_request(
            b"",
            b"bench",
            b"task:bench.emq_bench_tasks.noop",
            encode_run_body("bench.emq_bench_tasks", "noop"),
        )
        self.protocol = F.PROTOCOL
        self.batch = 1  # jobs per REQUEST the worker takes (its INFORM's "batch")

    def start_worker(self) -> int:
        if self.kind == "zmq":
            cmd = [sys.executable, "-m", "bench.zmq_ref", "worker", self.url, "100"]
            return subprocess.Popen(cmd).pid
        from emq_django.worker.process import SlotConfig, SlotWorker
        from emq_django.worker.slots import SlotTable

        cfg = SlotConfig(
            broker_url=self.url,
            queues=((10, "bench"),),
            manager="worker-loop-bench",
            slot=0,
            heartbeat_interval=1.0,
            heartbeat_liveness=3,
            prefetch=64,
        )
        table = SlotTable(1)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = SlotWorker(cfg, table).run()
            finally:
                os._exit(code)
        return pid

    def read(self) -> None:
        while self.router.poll(0):
            frames = self.router.recv_multipart()
            self.peer = frames[0]
            if self.kind == "zmq":  # a READY: the credit back, and (after a job) done
                self.credit += 1
                if self.sent:
                    self.finished += 1
                continue
            command = frames[3] if len(frames) > 3 else b""
            if command == b"INFORM" and len(frames) > 7:
                import json

                self.batch = max(1, int(json.loads(frames[7]).get("batch", 1)))
                if self.batch > 1:  # as our broker: an ACK that says batches are welcome
                    ack = [self.peer, b"", self.protocol, b"ACK", b"ack", frames[4]]
                    self.router.send_multipart([*ack, b"batch:%d" % self.batch])
            elif command == b"READY":  # one credit, or several (the "batch" extension)
                self.credit += int(frames[5]) if len(frames) > 5 else 1
            elif command == b"REPLY":  # one answer, or several (the "batch" extension)
                for status in frames[7::3]:
                    self.finished += 1
                    if b"ready" in status:
                        self.credit += 1
            elif command == b"HEARTBEAT":
                self.router.send_multipart(
                    [self.peer, b"", self.protocol, b"HEARTBEAT", b"hb", b"%f" % time.time()]
                )
        while self.done.poll(0):
            self.done.recv()

    def send_job(self, total: int) -> None:
        """One job, or (a worker that takes several per REQUEST) as many as its
        credit allows, in one message, as the broker sends them."""
        if self.kind == "zmq":
            self.router.send_multipart([self.peer, b"client", b""])
            self.sent += 1
            self.credit -= 1
            return
        count = max(1, min(self.credit, self.batch, total - self.sent))
        frames = list(self.job)
        frames[3] = b"job%d" % self.sent
        for i in range(1, count):
            frames += [b"job%d" % (self.sent + i), *self.job[4:]]
        self.router.send_multipart([self.peer, *frames])
        self.sent += count
        self.credit -= count


def one_run(
    kind: str, jobs: int, rate: float, done: zmq.Socket[bytes], ctx: zmq.Context[Any]
) -> dict[str, Any]:
    d = Driver(kind, ctx, done)
    pid = d.start_worker()
    total = WARM_UP + jobs
    interval = 1.0 / rate if rate else 0.0
    due = time.perf_counter()
    before: dict[str, float] | None = None
    t0 = 0.0
    try:
        deadline = time.monotonic() + 60 + jobs / 100
        while d.finished < total:
            if time.monotonic() > deadline:
                raise SystemExit(f"{kind}: only {d.finished} of {total} jobs done")
            if before is None and d.finished >= WARM_UP:
                before, t0 = thread_cpu(pid), time.perf_counter()
            d.read()
            now = time.perf_counter()
            if d.credit > 0 and d.sent < total and now >= due:
                d.send_job(total)
                due = max(due + interval, now - 0.01) if interval else now
            elif d.credit > 0 and d.sent < total:
                d.router.poll(max(0, int((due - now) * 1000)))
            else:
                d.router.poll(5)
        after, elapsed = thread_cpu(pid), time.perf_counter() - t0
    finally:
        os.kill(pid, 15)
        os.waitpid(pid, 0)
        d.router.close(0)
    assert before is not None
    per_job = {k: (v - before.get(k, 0.0)) / jobs * 1e6 for k, v in after.items()}
    return {"total": sum(per_job.values()), "threads": per_job, "rate": jobs / elapsed}


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--rate", type=float, default=1000.0, help="jobs/s at most (0: no pacing)")
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--only", default="emq,zmq")
    opts = ap.parse_args()
    ctx: zmq.Context[Any] = zmq.Context()
    done = ctx.socket(zmq.PULL)
    os.environ["BENCH_DONE_URL"] = f"tcp://127.0.0.1:{done.bind_to_random_port('tcp://127.0.0.1')}"
    import django

    django.setup()
    import bench.emq_bench_tasks  # noqa: F401  (registers the no-op task)

    kinds = opts.only.split(",")
    totals: dict[str, list[float]] = {k: [] for k in kinds}
    for pair in range(opts.pairs):
        for kind in kinds if pair % 2 == 0 else kinds[::-1]:
            r = one_run(kind, opts.jobs, opts.rate, done, ctx)
            totals[kind].append(r["total"])
            threads = " ".join(f"{k} {v:.0f}" for k, v in sorted(r["threads"].items()))
            print(f"{kind}: {r['total']:.0f} µs CPU per job ({threads}) at {r['rate']:.0f} jobs/s")
    medians = {k: sorted(v)[len(v) // 2] for k, v in totals.items() if v}
    print("medians:", ", ".join(f"{k} {v:.0f} µs" for k, v in medians.items()))
    if "emq" in medians and medians.get("zmq"):
        print(f"emq / raw forwarder's worker: {medians['emq'] / medians['zmq']:.2f}x")
    print("load average:", ", ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
