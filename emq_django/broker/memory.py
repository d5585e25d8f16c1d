"""Giving memory back after a backlog drains.

A broker that held a million jobs keeps the memory of the peak unless it acts:
a dict keeps its largest table when its entries are deleted; the ids the
de-duplication window keeps were allocated among the jobs' objects and keep
whole allocator arenas alive; glibc keeps freed heap for later. So once the
jobs the broker holds have fallen by a lot, the server rebuilds the core's
indexes at their present size (``BrokerCore.compact``) and asks glibc to return
its free pages (``malloc_trim``). ``Reclaimer`` says when; it is pure (the
caller passes ``now`` and the count), so that it can be tested with a fake clock.

Python's own small-object allocator (pymalloc) gives an arena (1 MB) back only
once every object in it is freed: a drained backlog's arenas each kept alive by
a few survivors (an id kept for de-duplication, a reply, a socket's buffer
allocated during the drain) stay resident, compaction or not. glibc's malloc
returns whole free pages from the middle of its heap on ``malloc_trim``, so
there only the pages that hold a survivor stay. So the broker, started from the
command line, re-executes itself once with ``PYTHONMALLOC=malloc``
(``EMQ_BROKER_PYTHONMALLOC``; ``allocator_reexec`` says whether and how).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import sys
from collections.abc import Callable, Mapping, Sequence

# the cyclic collector's thresholds in the broker's process (``tune_gc``)
GC_YOUNG = 50_000
GC_OLDER = 20
MIN_DROP = 50_000  # jobs: below this a reclaim returns too little to be worth it
INTERVAL = 5.0  # seconds: at most one reclaim this often (a compaction copies indexes)
CHECK_EVERY = 1.0  # seconds between two looks at the count
QUIET = 1_000  # jobs per check: moving less than this, the broker is (nearly) idle
IDLE = "idle"  # what Reclaimer.due says: the drain is over (compact, then trim)
DRAINING = "draining"  # ... half way down a backlog still draining (trim only)


class Reclaimer:
    """When to give memory back, once the jobs the broker holds have fallen by
    ``min_drop`` at least. ``DRAINING`` (trim only) each time the count is at half
    its peak since the last reclaim or less. ``IDLE`` (compact, then trim) when
    the count is (nearly) still (it moved by less than ``quiet`` since the last
    check: the drain is over, or jobs come and go at the same rate) and at an
    eighth of its peak since the last ``IDLE`` or less: a compaction copies what
    is still held, and a broker stalled half way down (a guaranteed backlog
    reading its journal on a loaded machine) looks still too. At most once per
    ``interval`` seconds."""

    def __init__(
        self,
        min_drop: int = MIN_DROP,
        interval: float = INTERVAL,
        check_every: float = CHECK_EVERY,
        quiet: int = QUIET,
    ) -> None:
        self.min_drop = min_drop
        self.interval = interval
        self.check_every = check_every
        self.quiet = quiet
        self.peak = 0  # highest count since the last reclaim
        self.high = 0  # highest count since the last reclaim while quiet
        self.last_count = 0
        self.next_check = float("-inf")
        self.next_allowed = float("-inf")
        self.reclaims = 0

    def due(self, held: int, now: float) -> str | None:
        """Whether to reclaim now, given the ``held`` count (``BrokerCore.footprint``):
        None, ``IDLE`` (the drain is over) or ``DRAINING`` (half way down)."""
        if now < self.next_check:
            return None
        self.next_check = now + self.check_every
        moved, self.last_count = abs(held - self.last_count), held
        self.peak = max(self.peak, held)
        self.high = max(self.high, held)
        if now < self.next_allowed:
            return None
        if moved < self.quiet and self.high - held >= self.min_drop and held <= self.high // 8:
            self.high = held
            why = IDLE
        elif self.peak - held >= self.min_drop and held <= self.peak // 2:
            why = DRAINING
        else:
            return None
        self.peak = held
        self.next_allowed = now + self.interval
        self.reclaims += 1
        return why


def _find_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where there is none (musl, macOS)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_malloc_trim = _find_malloc_trim()


def trim_heap() -> bool:
    """Return the C heap's free pages to the system; False where that cannot be done."""
    if _malloc_trim is None:
        return False
    _malloc_trim(0)
    return True


def allocator_reexec(
    wanted: str,
    environ: Mapping[str, str],
    executable: str | None = None,
    orig_argv: Sequence[str] | None = None,
) -> tuple[list[str], dict[str, str]] | None:
    """The command line and environment to re-execute this process with
    ``PYTHONMALLOC=wanted``, or None: nothing is wanted ('', or ``pymalloc``,
    which Python runs with anyway), ``PYTHONMALLOC`` is set already (by whoever
    started us, or by a re-execution: never twice), the C heap cannot be trimmed
    here (no glibc: the change would gain nothing), the interpreter ignores
    ``PYTHON*`` variables (``-E``, ``-I``), or its command line is not known.
    ``executable`` and ``orig_argv`` default to ``sys.executable`` and
    ``sys.orig_argv`` (the interpreter's own options included, so that
    ``python -X ...`` stays so)."""
    if wanted in ("", "pymalloc") or "PYTHONMALLOC" in environ or _malloc_trim is None:
        return None
    if sys.flags.ignore_environment:  # python -E or -I: PYTHONMALLOC would be ignored
        return None
    executable = sys.executable if executable is None else executable
    argv = list(sys.orig_argv if orig_argv is None else orig_argv)
    if not executable or len(argv) < 2:
        return None
    return [executable, *argv[1:]], {**environ, "PYTHONMALLOC": wanted}


def allocator_name() -> str:
    """The allocator this process started with: ``PYTHONMALLOC``, else ``pymalloc``
    (what a release build of CPython uses by default)."""
    if sys.flags.ignore_environment:
        return "pymalloc"
    return os.environ.get("PYTHONMALLOC") or "pymalloc"


def rss_bytes() -> int:
    """This process's resident set size (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


def tune_gc() -> None:
    """Tune the cyclic garbage collector for the broker's process.

    What the broker allocates per job (the job, its effects, frames, lists)
    dies young and makes no cycles, and what lives long (Django, the ports,
    the settings) was all made before the loop. Yet the collector runs every
    700 net new objects, and while a backlog builds it goes through every
    waiting job again and again (gen 1, then gen 2): about 5% of the broker's
    CPU while it drained no-op jobs (perf). So: what start-up made is moved
    out of the collector's sight (``gc.freeze``), and the young generation is
    collected every ``GC_YOUNG`` net new objects instead. Cycles (rare here)
    are still collected, a little later."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG, GC_OLDER, GC_OLDER)
