"""Draining one of our job managers from the monitor channel (issue 35), neutral to
protocols: ``MANAGER DRAIN <name>`` and ``MANAGER RESUME <name>`` (the ``admin``
role; ``broker/ports/monitor_live.py`` parses them), and ``MANAGER STOP <name>``:
drained, and told to stop (eMQP ``STOP``, docs/eventmq-wire.md section 7): it
does as on its first SIGTERM, its running jobs finish and it exits.
``MANAGER RESIZE <name> <n>``: it runs ``n`` worker processes from now on (eMQP
``RESIZE``): it starts more, or stops idle ones first while busy ones finish their
running job; the broker's slots follow as the processes join and leave. ``n`` is
from 1 to the ``max_concurrency`` its INFORM gave (its shared tables are made for
that many before it forks); a job manager that gave none (an older one) is refused.

A drained job manager keeps its connections and finishes the jobs it has (their
answers count as usual); the broker sends it no new one, and the other job
managers of its queues take them. Its worker processes are taken out of their
queues' servers (their ``queues`` are kept aside in ``drained_queues``), so the
dispatch path is unchanged and costs nothing more; a worker process that joins
while it is drained (a recycled one) is held the same way. ``RESUME`` puts them
back, and the credit they gave meanwhile takes the waiting jobs at once. The drain
lasts until resumed or the broker restarts (it is not journaled); a restarted job
manager (a new incarnation) is not drained.

EventMQ's and Majordomo's workers are refused with the reason: nothing in their
protocols tells them, and the broker cannot tell their free workers from a new
one (stop them with SIGTERM: EventMQ's job manager finishes its jobs first).
"""

from __future__ import annotations

from typing import Any

from emq_django.broker.effects import Resize, Stop
from emq_django.broker.state import ROLE_MANAGER, ROLE_PLAIN, ROLE_SLOT, Peer, show_identity

# (the core is ``Any`` here: broker/core.py imports this module for ``hold``)
BrokerCore = Any


class NotDrainable(ValueError):
    """The named job manager cannot be drained (the reason is the message)."""


def _peers_of(core: BrokerCore, name: str) -> list[Peer]:
    peers = [p for p in core.peers if (p.manager_name or "") == name]
    if not peers:
        plain = [p for p in core.peers if p.role == ROLE_PLAIN and _shown(p) == name]
        if plain:
            kind = "a Majordomo worker" if plain[0].peer_type == "mdp" else "an EventMQ job manager"
            raise NotDrainable(
                f"{name} is {kind}: its protocol has no drain command "
                "(stop it with SIGTERM: it finishes its running jobs first)"
            )
        raise NotDrainable(f"no job manager named {name} is connected")
    return peers


def _shown(peer: Peer) -> str:
    return show_identity(peer.identity)


def hold(core: BrokerCore, peer: Peer) -> None:
    """Take ``peer`` out of its queues' servers: no new job goes to it."""
    if not peer.queues:
        return
    peer.meta["drained_queues"] = [[w, n] for w, n in peer.queues]
    for _weight, name in peer.queues:
        queue = core.queues.get(name)
        if queue is not None:
            queue.remove_server(peer)  # (and out of its ready tiers)
    peer.queues = ()


def release(core: BrokerCore, peer: Peer, now: float) -> None:
    """Back into its queues; its credit takes the waiting jobs."""
    kept = peer.meta.pop("drained_queues", None)
    if not kept:
        return
    peer.queues = tuple((int(w), str(n)) for w, n in kept)
    for weight, name in peer.queues:
        core._queue(name).add_server(peer, weight)
    credit, peer.credit = peer.credit, 0  # (in no tier yet: worker_credit readies it)
    core.worker_credit(peer, credit, now)


def drain(core: BrokerCore, name: str) -> dict[str, Any]:
    peers = _peers_of(core, name)
    keys = {p.manager for p in peers if p.manager}
    was = bool(keys) and keys <= core.drained_managers
    core.drained_managers.update(keys)
    for peer in peers:
        hold(core, peer)
    return {
        "job_manager": name,
        "drained": True,
        "was_drained": was,
        "running": sum(len(p.inflight) for p in peers),
    }


def resume(core: BrokerCore, name: str, now: float) -> dict[str, Any]:
    peers = _peers_of(core, name)
    keys = {p.manager for p in peers if p.manager}
    was = bool(keys & core.drained_managers)
    core.drained_managers.difference_update(keys)
    before = core.counters["dispatched"]
    for peer in peers:
        release(core, peer, now)
    return {
        "job_manager": name,
        "drained": False,
        "was_drained": was,
        "dispatched": core.counters["dispatched"] - before,
    }


def stop(core: BrokerCore, name: str) -> dict[str, Any]:
    """Drain it, and tell its control connection to stop (eMQP ``STOP``)."""
    peers = _peers_of(core, name)
    controls = [p for p in peers if p.role == ROLE_MANAGER]
    if not controls:
        raise NotDrainable(f"{name} has no control connection to tell (an old job manager?)")
    doc = drain(core, name)
    for control in controls:
        core.out.append(Stop(control))
    return {**doc, "stopping": True}


def resize(core: BrokerCore, name: str, concurrency: int) -> dict[str, Any]:
    """Tell its control connection to run ``concurrency`` worker processes."""
    peers = _peers_of(core, name)
    controls = [p for p in peers if p.role == ROLE_MANAGER]
    if not controls:
        raise NotDrainable(f"{name} has no control connection to tell (an old job manager?)")
    control = controls[-1]  # (the newest: an older one is a connection going away)
    ceiling = control.meta.get("max_concurrency")
    if not isinstance(ceiling, int) or isinstance(ceiling, bool):
        raise NotDrainable(f"{name} cannot be resized: it is a job manager from before RESIZE")
    if not 1 <= concurrency <= ceiling:
        raise NotDrainable(
            f"{name} can run from 1 to {ceiling} worker processes "
            f"(its --max-concurrency), not {concurrency}"
        )
    was = control.meta.get("concurrency")
    control.meta["concurrency"] = concurrency  # (the monitor's; its processes follow)
    core.out.append(Resize(control, concurrency))
    return {
        "job_manager": name,
        "concurrency": concurrency,
        "was": was,
        "max_concurrency": ceiling,
        "processes": sum(1 for p in peers if p.role == ROLE_SLOT),
    }
