"""The clients' lifetime in this process: the registry of every client, the
flusher thread that sends a client's coalesced jobs, and the fork and exit hooks.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from typing import Any

from emq_django import wire
from emq_django.exceptions import (
    JobsRefused,
)
from emq_django.protocol import batch as B
from emq_django.protocol import frames as F

log = logging.getLogger(__name__)

# The backend's calls with plain int flags (emq_django/wire.py says why); the
# REQUEST path below unrolls its seven frames onto them.
_send = wire._send
_recv = wire._recv
_SNDMORE = wire.SNDMORE
_NOBLOCK = wire.NOBLOCK
_MORE_NOBLOCK = _SNDMORE | _NOBLOCK
_POLLIN = wire._POLLIN
_ACK_ID_LENGTH = B.ACK_ID_LENGTH  # the msgid of our broker's ACK, naming its incarnation
_monotonic = time.monotonic
_PROTOCOL = F.PROTOCOL
_encode_request = F.encode_request
_ACK = F.ACK
_REPLY = F.REPLY
_MAX_ID = F.MAX_ID_LENGTH
EXIT_WAIT = 2.0  # seconds the interpreter's exit waits for the last ACKs, at most

_pid = os.getpid()  # this process's, kept by the fork hook: no system call per job
_clients: weakref.WeakSet[Any] = weakref.WeakSet()  # every client: fork and exit


class _Flusher(threading.Thread):
    """Sends a client's buffered jobs COALESCE_WAIT after the first (one daemon
    thread per client that coalesces; it sleeps on ``wake`` while nothing waits)."""

    alive = 0  # such threads in this process (not "other threads" for the waits)

    def __init__(self, client: Any) -> None:
        super().__init__(name="emq-client-flusher", daemon=True)
        self.wake = threading.Event()
        self.idle = True  # waits on ``wake`` (set and read under the client's lock)
        self._client = weakref.ref(client)
        self._pid = os.getpid()

    def run(self) -> None:
        _Flusher.alive += 1
        try:
            while True:
                self.wake.wait()
                self.wake.clear()  # before looking: a job buffered later sets it again
                client = self._client()
                if client is None or client._flusher is not self or _pid != self._pid:
                    return
                client._flush_due(self)
                del client
        finally:
            _Flusher.alive -= 1


def _after_fork_in_child() -> None:
    """A child never sends its parent's buffered jobs (the parent does), and has
    none of its threads: each client forgets its buffer, flusher and lock."""
    global _pid
    _pid = os.getpid()
    _Flusher.alive = 0
    for client in list(_clients):
        client._buf = []
        client._buf_jobs = client._buf_bytes = 0
        client._flusher = None
        client._lock = threading.RLock()  # a parent's thread may have held it


def _send_at_exit() -> None:
    """The interpreter is ending: send what is buffered, and wait (EXIT_WAIT at
    most) for the broker's ACK of every pipelined send, so that no job sent by
    ``delay()`` just before the end is lost with the process's queues."""
    for client in list(_clients):
        if not client._lock.acquire(timeout=EXIT_WAIT):
            continue
        try:
            if client._sock is not None and client._unacked():
                client._wait_below(1, EXIT_WAIT)
            if client._refused:
                client._raise_refused()
        except JobsRefused as exc:  # the end of the process: say so, do not raise
            log.error("at exit: %s", exc)
        except Exception as exc:  # the end of the process: say so, do not raise
            log.warning("at exit, jobs may not have reached the broker: %s", exc)
        finally:
            client._lock.release()


atexit.register(_send_at_exit)


os.register_at_fork(after_in_child=_after_fork_in_child)
