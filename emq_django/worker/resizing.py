"""A job manager's pool resize (the broker's eMQP ``RESIZE``, the admin's control):
which worker processes to stop and which slots to start. Pure, on the job manager's
``children`` (pid -> slot) and its slot table.

Its shared tables (``SlotTable``, ``KeptRecords``) are made before it forks, for
``capacity`` slots: ``--max-concurrency``, by default the larger of
``--concurrency`` and ``DEFAULT_MAX_CONCURRENCY`` (anonymous memory: a slot that
never runs a process costs address space only). A shrink stops idle processes
first (SIGTERM: a process gives back the jobs it had not started, and exits), then
busy ones, which finish their running job first; a grow starts processes in free
slots. The processes join and leave the broker as ever, so its slots follow.
"""

from __future__ import annotations

from typing import Protocol

DEFAULT_MAX_CONCURRENCY = 64


class _Table(Protocol):
    def read(self, slot: int) -> tuple[bytes, float, float]: ...


def capacity(concurrency: int, max_concurrency: int) -> int:
    """The slots a job manager's tables are made for."""
    return max(concurrency, max_concurrency or DEFAULT_MAX_CONCURRENCY)


def to_stop(children: dict[int, int], retiring: set[int], table: _Table, wanted: int) -> list[int]:
    """The processes to stop so that ``wanted`` go on running: idle ones (no attempt
    in their slot) first, then busy ones; none of those stopping already."""
    active = [pid for pid in children if pid not in retiring]
    extra = len(active) - wanted
    if extra <= 0:
        return []
    idle = [pid for pid in active if not table.read(children[pid])[0]]
    busy = [pid for pid in active if table.read(children[pid])[0]]
    return (idle + busy)[:extra]


def to_start(children: dict[int, int], retiring: set[int], slots: int, wanted: int) -> list[int]:
    """The free slots to start processes in so that ``wanted`` run (not counting
    those stopping), lowest first; fewer when the free slots run out."""
    missing = wanted - (len(children) - len(retiring & children.keys()))
    if missing <= 0:
        return []
    used = set(children.values())
    return [slot for slot in range(slots) if slot not in used][:missing]
