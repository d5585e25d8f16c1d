"""The harness's completion sink: counts the no-op tasks' PUSHes.

    python -m bench.sink PULL_URL CONTROL_URL

Tasks PUSH one empty message each to PULL_URL (``bench/donesignal.py``). The
producer asks on CONTROL_URL (REQ/REP) with ``WAIT <target> <ms>``: the answer
is the count as soon as it reaches ``target``, or after ``ms`` milliseconds
otherwise, so the end of a drain is seen when it happens, without polling.
This process is the harness's: its CPU is reported apart and counted in no role.
"""

from __future__ import annotations

import sys
import time

import zmq


def parse_wait(request: bytes) -> tuple[int, int]:
    """``b"WAIT 100 250"`` -> (100, 250). Raises ValueError on anything else."""
    parts = request.split()
    if len(parts) != 3 or parts[0] != b"WAIT":
        raise ValueError(f"expected b'WAIT <target> <ms>', got {request!r}")
    return int(parts[1]), int(parts[2])


def serve(pull_url: str, control_url: str) -> None:
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVHWM, 0)
    pull.bind(pull_url)
    rep = ctx.socket(zmq.REP)
    rep.bind(control_url)
    poller = zmq.Poller()
    poller.register(pull, zmq.POLLIN)
    poller.register(rep, zmq.POLLIN)
    count = 0
    waiting: tuple[int, float] | None = None  # (target, deadline)
    while True:
        timeout = None
        if waiting is not None:
            timeout = max(0, int((waiting[1] - time.monotonic()) * 1000))
        events = dict(poller.poll(timeout))
        if pull in events:
            while True:
                try:
                    pull.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                count += 1
        if rep in events:
            target, ms = parse_wait(rep.recv())
            waiting = (target, time.monotonic() + ms / 1000)
        if waiting is not None and (count >= waiting[0] or time.monotonic() >= waiting[1]):
            rep.send(b"%d" % count)
            waiting = None


if __name__ == "__main__":
    try:
        serve(sys.argv[1], sys.argv[2])
    except KeyboardInterrupt:
        pass
