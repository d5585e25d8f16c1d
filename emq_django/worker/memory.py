"""What our job manager reports of its memory (protocol/memory_report.py): the
resident set of its own process and of each worker process, read from
``/proc/<pid>/statm`` (Linux) at most once every ``REPORT_EVERY`` seconds."""

from __future__ import annotations

import os
import resource
import sys
import time
from collections.abc import Callable, Iterable

from emq_django.protocol.memory_report import encode_memory

REPORT_EVERY = 5.0  # seconds
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss(pid: int) -> int | None:
    """The resident set of ``pid`` in bytes; None when it cannot be read (gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


def _own_rss() -> int:
    found = rss(os.getpid())
    if found is not None:
        return found
    # no /proc (macOS): the peak resident set, in bytes there (kB on Linux)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


class MemoryReport:
    """The HEARTBEAT's report frame when one is due, else ``b""``."""

    def __init__(self, pids: Callable[[], Iterable[int]], every: float = REPORT_EVERY) -> None:
        self.pids = pids  # the worker processes now
        self.every = every
        self.next_at = 0.0  # the first heartbeat reports

    def __call__(self) -> bytes:
        now = time.monotonic()
        if now < self.next_at:
            return b""
        self.next_at = now + self.every
        processes = {}
        for pid in self.pids():
            found = rss(pid)
            if found is not None:
                processes[pid] = found
        return encode_memory(_own_rss(), processes)
