"""The monitor channel's documents: ``MONITOR`` (PZQ-style lines) and ``MONITOR JSON``."""

from __future__ import annotations

import base64
import json
from typing import TYPE_CHECKING, Any

from emq_django.broker.priority import RankedPending
from emq_django.broker.state import ROLE_MANAGER, ROLE_PLAIN, ROLE_SLOT, Peer, show_identity

if TYPE_CHECKING:
    from emq_django.broker.core import BrokerCore
    from emq_django.broker.topics import Event


def _group_key(peer: Peer) -> str:
    return peer.manager if peer.role != "plain" and peer.manager else show_identity(peer.identity)


def _group_name(peer: Peer) -> str:
    return peer.manager_name or show_identity(peer.identity)


def job_managers(core: BrokerCore, now: float, wall: float) -> list[dict[str, Any]]:
    """One entry per job manager: ours (a control peer plus slot peers) or EventMQ's."""
    groups: dict[str, dict[str, Any]] = {}
    for peer in core.peers:
        key = _group_key(peer)
        entry = groups.get(key)
        if entry is None:
            entry = groups[key] = {
                "identity": _group_name(peer),
                "host": None,
                "pid": None,
                "kind": "majordomo" if peer.peer_type == "mdp" else "eventmq",
                "queues": peer.meta.get("drained_queues") or [[w, n] for w, n in peer.queues],
                "slots": 0,
                "free_slots": 0,
                "busy": 0,
                "jobs_done": 0,  # attempts finished, failed ones too
                "jobs_failed": 0,  # of those: failed, timed out, or their process lost
                # its own and its worker processes' RSS, as it last reported them;
                # None: not reported (EventMQ's, or an older one of ours)
                "memory_bytes": None,
                "last_heartbeat": None,
                "draining": False,
                # the admin drained it (broker/manager_control.py): no new jobs
                "drained": peer.manager in core.drained_managers,
            }
        seen = wall - (now - peer.last_seen)
        if entry["last_heartbeat"] is None or seen > entry["last_heartbeat"]:
            entry["last_heartbeat"] = round(seen, 3)
        entry["draining"] = entry["draining"] or peer.draining
        if peer.role == ROLE_MANAGER:
            entry.update(
                kind="emq",
                host=peer.meta.get("host"),
                pid=peer.meta.get("pid"),
                concurrency=peer.meta.get("concurrency"),
                # the most a RESIZE may ask for (manager_control.resize)
                max_concurrency=peer.meta.get("max_concurrency"),
            )
            if peer.memory is not None:
                entry.update(_memory(peer.memory))
            continue
        if peer.role == ROLE_SLOT:
            entry["kind"] = "emq"
            entry.setdefault("host", peer.meta.get("host"))
        entry["slots"] += 1 if peer.role == ROLE_SLOT else max(peer.credit + len(peer.inflight), 0)
        entry["free_slots"] += max(peer.credit, 0)  # (below 0: sent beyond it)
        entry["busy"] += len(peer.inflight)
        if peer.role == ROLE_PLAIN:
            entry["jobs_done"] += peer.jobs_done
            entry["jobs_failed"] += peer.jobs_failed
    for key, entry in groups.items():
        if entry["kind"] == "emq":  # kept per job manager: worker processes are replaced
            entry["jobs_done"] = core.done_by_manager.get(key, 0)
            entry["jobs_failed"] = core.failed_by_manager.get(key, 0)
    return sorted(groups.values(), key=lambda e: str(e["identity"]))


def _memory(report: dict[str, Any]) -> dict[str, Any]:
    """A job manager's memory report as its monitor entry shows it."""
    processes = report.get("processes", {})
    return {
        "memory_bytes": report["rss"] + sum(processes.values()),
        "memory": {"job_manager": report["rss"], "processes": processes},
    }


def queues(core: BrokerCore, now: float | None = None) -> list[dict[str, Any]]:
    result = []
    unique = core.unique.by_queue(now) if now is not None and len(core.unique) else {}
    for queue in core.queues.values():
        serving: dict[str, dict[str, Any]] = {}
        for peer, weight in queue.servers.items():
            if peer not in core.peers:
                continue
            key = _group_key(peer)
            entry = serving.setdefault(
                key, {"identity": _group_name(peer), "weight": weight, "free_slots": 0}
            )
            entry["free_slots"] += max(peer.credit, 0)  # (below 0: sent beyond it)
        result.append(
            {
                "name": queue.name,
                "depth": len(queue.pending),
                "in_flight": queue.in_flight,
                "paused": queue.paused,
                "job_managers": sorted(serving.values(), key=lambda e: -e["weight"]),
            }
        )
        if isinstance(queue.pending, RankedPending):  # waiting jobs by priority
            result[-1]["by_priority"] = {str(p): n for p, n in queue.pending.by_priority().items()}
        rate = core.flow.queue_rates.get(queue.name)
        if rate is not None:  # EMQ_RATE_LIMITS, or QUEUE RATE since: jobs per second
            result[-1]["rate_limit"] = rate
        if queue.gated and now is not None:  # held back by flow control (broker/flow.py)
            result[-1].update(core.flow.waiting(queue, now, core.inflight))
        if queue.name in unique:  # unique jobs' keys held (broker/unique.py)
            result[-1]["unique_keys"] = unique[queue.name]
    return sorted(result, key=lambda q: q["name"])


def snapshot(core: BrokerCore, now: float, wall: float, info: dict[str, Any]) -> dict[str, Any]:
    limit = core.config.heartbeat_interval * core.config.heartbeat_liveness
    return {
        "broker": {
            **info,
            "uptime": round(now - core.started_at, 3),
            "stopping": core.stopping,
            "heartbeat_interval": core.config.heartbeat_interval,
            "peer_timeout": limit,
            "time": wall,
        },
        "counters": dict(core.counters),
        "queues": queues(core, now),
        "job_managers": job_managers(core, now, wall),
        "schedulers": [
            {
                "identity": show_identity(p.identity),
                "host": p.meta.get("host"),
                "pid": p.meta.get("pid"),
                "last_heartbeat": round(wall - (now - p.last_seen), 3),
            }
            for p in core.schedulers
        ],
        "held_schedules": len(core.held_schedules),
        "dead_letters": len(core.life.dead),
        "delayed": len(core.life.delayed),
        "in_flight": len(core.inflight),
        # running now, and ended since the broker started (broker/workflows.py)
        "workflows": dict(core.workflows.counts),
    }


def event_doc(event: Event) -> dict[str, Any]:
    """One kept event for ``TOPIC LATEST``: its data in base64 (JSON carries no bytes)."""
    return {
        "seq": event.seq,
        "topic": event.topic,
        "ts": event.ts,
        "producer": event.producer,
        "uuid": event.uuid.hex(),
        "content_type": event.content_type,
        "headers": [list(h) for h in event.headers],
        "data": base64.b64encode(event.data).decode("ascii"),
    }


def as_json(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def as_lines(doc: dict[str, Any]) -> bytes:
    """PZQ-style ``key: value`` lines."""
    depth = sum(q["depth"] for q in doc["queues"])
    lines = {
        "messages": depth,
        "messages_inflight": doc["in_flight"],
        "queues": len(doc["queues"]),
        "job_managers": len(doc["job_managers"]),
        "schedulers": len(doc["schedulers"]),
        "uptime": doc["broker"]["uptime"],
        **doc["counters"],
    }
    ha = doc.get("ha")
    if ha:
        lines.update({f"ha.{k}": ha.get(k) for k in ("role", "name", "epoch", "active")})
    for q in doc["queues"]:
        lines[f"queue.{q['name']}.depth"] = q["depth"]
        lines[f"queue.{q['name']}.in_flight"] = q["in_flight"]
    topics = doc.get("topics")
    if topics:
        lines["topics.last_seq"] = topics["last_seq"]
        lines["topics.published"] = topics["published"]
        lines["topics.count"] = len(topics["topics"])
        for port, figures in topics.get("ports", {}).items():
            lines[f"topics.{port}.subscribers"] = figures.get("subscribers", 0)
    return "".join(f"{k}: {v}\n" for k, v in lines.items()).encode()
