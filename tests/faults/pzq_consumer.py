"""A PZQ consumer process for the fault-injection suite (tests/pzq_client.py's
Consumer): each message's body is its key; it appends a ``done`` line to the history
file, then acks, until it is killed.

``--hold-after N``: after N messages it stops acking and appends a ``held`` line
for each further message instead (a consumer stuck holding what it was given,
until a ``kill -9``).

    python -m tests.faults.pzq_consumer SEND_URL HISTORY_FILE [--hold-after N]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import zmq

from tests.pzq_client import Consumer


def record(path: str, kind: str, key: str) -> None:
    """One small O_APPEND write per line: several consumers' lines never mix."""
    line = json.dumps({"kind": kind, "key": key, "pid": os.getpid(), "t": time.time()})
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("history")
    parser.add_argument("--hold-after", type=int, default=-1)
    args = parser.parse_args()
    ctx: zmq.Context[Any] = zmq.Context()
    consumer = Consumer(ctx, args.url)
    taken = 0
    print("consuming", flush=True)
    while True:
        d = consumer.recv(timeout=1.0)
        if d is None:
            continue
        key = b"".join(d.body).decode()
        taken += 1
        if 0 <= args.hold_after < taken:
            record(args.history, "held", key)
            continue
        record(args.history, "done", key)
        consumer.ack(d)


if __name__ == "__main__":
    main()
