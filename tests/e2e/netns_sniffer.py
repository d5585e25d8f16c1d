"""A packet sniffer for tests/e2e/test_netns.py, run inside a network namespace
(``ip netns exec NS python netns_sniffer.py OUT IFACE...``): a raw AF_PACKET
socket, so no tcpdump is needed.

Every frame seen on the named interfaces is appended to OUT as a record: 4 bytes
big-endian length, then the frame (Ethernet header included). It writes
``ready`` on stdout once the socket is open, and stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import signal
import socket
import struct
import sys
from types import FrameType

ETH_P_ALL = 0x0003
_running = True


def _stop(signum: int, frame: FrameType | None) -> None:
    global _running
    _running = False


def main(out_path: str, interfaces: list[str]) -> None:
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.settimeout(0.2)
    wanted = set(interfaces)
    with open(out_path, "wb", buffering=0) as out:
        print("ready", flush=True)
        while _running:
            try:
                frame, address = sock.recvfrom(65535)
            except TimeoutError:
                continue
            except InterruptedError:
                continue
            if address[0] in wanted:
                out.write(struct.pack(">I", len(frame)) + frame)
    sock.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
