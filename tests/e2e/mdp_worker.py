"""A Majordomo worker for the tests: majortomo 0.2.0's own Worker (the released peer).

    python -m tests.e2e.mdp_worker URL SERVICE MODE [MARKER]

MODE ``echo``: FINAL with the request's frames. ``partials``: two PARTIALs
(``p1``, ``p2``) then FINAL ``done``. ``json``: emq's reply bodies, for an emq
client: PARTIAL ``{"value": "part-1"}``, ``{"value": "part-2"}``, then FINAL
``{"value": <the number of request frames>}``. ``slow``: writes MARKER when a
request arrives, then sleeps for a minute before answering (to be killed).

A DISCONNECT from the broker (a new broker that never heard of this worker, after a
failover) is answered as the protocol says: close the socket and connect again on a
new one (majortomo's Worker closes it and raises ``Disconnected``; the program
connects again).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from majortomo import Worker
from majortomo.error import Disconnected


def main() -> None:
    url, service, mode = sys.argv[1], sys.argv[2].encode(), sys.argv[3]
    marker = Path(sys.argv[4]) if len(sys.argv) > 4 else None
    worker = Worker(url, service, heartbeat_interval=0.5)
    worker.connect()
    while True:
        try:
            client, frames = worker.wait_for_request()
        except Disconnected:
            worker.connect()
            continue
        if mode == "partials":
            worker.send_reply_partial(client, [b"p1"])
            worker.send_reply_partial(client, [b"p2"])
            worker.send_reply_final(client, [b"done"])
        elif mode == "json":
            for n in (1, 2):
                worker.send_reply_partial(client, [json.dumps({"value": f"part-{n}"}).encode()])
            worker.send_reply_final(client, [json.dumps({"value": len(frames)}).encode()])
        elif mode == "slow":
            if marker is not None:
                marker.write_text("got it")
            time.sleep(60)
            worker.send_reply_final(client, [b"slow"])
        else:
            worker.send_reply_final(client, frames)


if __name__ == "__main__":
    main()
