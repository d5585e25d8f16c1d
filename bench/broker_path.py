"""The broker's Python work per job, without sockets: the eMQP ports and the core
handle a REQUEST and its REPLY, and the effects are encoded (not sent).

    .venv/bin/python bench/broker_path.py [--jobs 50000] [--rounds 5] [--reply]
        [--priority N] [--backlog]

Prints the CPU µs per job of each round and their minimum: the part of the
broker's CPU per job that is ours (decode, bookkeeping, encode), apart from
libzmq's and pyzmq's per-frame costs. ``--priority 1``: the jobs carry a priority
(their queue is ranked: a heap, and a rank per job to the worker processes).
``--backlog``: every job waits first (the two worker processes have 4 credits
each), then each answer takes the next, as in a drain that the producer outruns.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from emq_django.broker.core import BrokerCore
from emq_django.broker.ports.emqp_clients import EmqpClientPort
from emq_django.broker.ports.emqp_workers import EmqpWorkerPort
from emq_django.broker.state import BrokerConfig

P = b"eMQP/1.0"


def one_round(jobs: int, reply: bool, priority: int = 0, backlog: bool = False) -> float:
    core = BrokerCore(BrokerConfig(), 0.0)
    core.life.journal_ops = []  # a journal, as in bench/run.py (nothing guaranteed)
    clients, workers = EmqpClientPort(core), EmqpWorkerPort(core)
    queues = json.dumps([[10, "bench"]]).encode()
    meta = {"role": "manager", "manager": "m", "incarnation": "1"}
    inform = [b"", P, b"INFORM", b"i0", queues, b"worker", json.dumps(meta).encode()]
    workers.handle(b"M", inform, 0)
    for s in (b"S1", b"S2"):
        meta = {"role": "slot", "manager": "m", "incarnation": "1", "slot": 0}
        frames = [b"", P, b"INFORM", b"i" + s, queues, b"worker", json.dumps(meta).encode()]
        workers.handle(s, frames, 0)
        for _ in range(4 if backlog else 20):
            workers.handle(s, [b"", P, b"READY", b"r"], 0)
    core.out.clear()
    headers = b"reply-requested,task:bench.echo,stream" if reply else b"task:bench.noop"
    if priority:
        headers += b",priority:%d" % priority
    body = b'[["bench.noop"],{"args":[],"kwargs":{}}]'
    requests = [[b"", P, b"REQUEST", b"job%d" % i, b"bench", headers, body] for i in range(jobs)]
    if backlog:
        return _backlog_round(core, clients, requests)
    started = time.process_time()
    now = 1.0
    for frames in requests:
        clients.handle(b"C", frames, now)
        batch, core.out = core.out, []
        for effect in batch:
            ref = effect.client if hasattr(effect, "client") else effect.peer
            sent = ref.port.encode(effect)
            if sent is not None and sent[2] == b"REQUEST":
                ref.port.handle(
                    ref.identity, [b"", P, b"REPLY", b"x", b"null", sent[3], b"ok,ready"], now
                )
        for effect in core.out:
            ref = effect.client if hasattr(effect, "client") else effect.peer
            ref.port.encode(effect)
        core.out = []
    return (time.process_time() - started) / jobs * 1e6


def _backlog_round(core: BrokerCore, clients: EmqpClientPort, requests: list[Any]) -> float:
    started = time.process_time()
    now = 1.0
    sent: list[tuple[Any, list[bytes]]] = []  # deliveries, answered in order

    def flush() -> None:
        batch, core.out = core.out, []
        for effect in batch:
            ref = effect.client if hasattr(effect, "client") else effect.peer
            frames = ref.port.encode(effect)
            if frames is not None and frames[2] == b"REQUEST":
                sent.append((ref, frames))

    for frames in requests:
        clients.handle(b"C", frames, now)
        flush()
    for ref, frames in sent:  # (grows as each answer takes the next)
        ref.port.handle(
            ref.identity, [b"", P, b"REPLY", b"x", b"null", frames[3], b"ok,ready"], now
        )
        flush()
    assert len(sent) == len(requests)
    return (time.process_time() - started) / len(requests) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=50000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reply", action="store_true")
    ap.add_argument("--priority", type=int, default=0)
    ap.add_argument("--backlog", action="store_true")
    opts = ap.parse_args()
    figures = []
    for _ in range(opts.rounds):
        figures.append(one_round(opts.jobs, opts.reply, opts.priority, opts.backlog))
        print(f"{figures[-1]:.2f} µs/job", flush=True)
    print(f"min {min(figures):.2f} µs/job")


if __name__ == "__main__":
    main()
