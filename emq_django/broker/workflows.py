"""Workflows kept by the broker: chain, group and chord (docs/features/workflows.md).

A workflow arrives as one REQUEST on ``WORKFLOW_QUEUE`` with its graph
(``protocol/workflow.py``). The broker starts its first steps as jobs of their
own queues, and when a step's job ends for good (``BrokerCore._answer``) it
starts what comes next: no polling and no result backend. Each node of the graph
starts at most once, so the workflow machinery never runs a step twice (a step's
own retries are its job's, as for any job).

Step jobs have the id ``<workflow id>/<node path>`` (``root.0.2``), and their
REPLY goes to the workflow's client too (``WorkflowResult.steps``). The
workflow's own REPLY (its msgid: the workflow id) carries the final value, or
the error of the step that ended it, named in the message.

The broker decodes the JSON of a workflow's body and of its steps' results (a
step's result is the next step's argument); it never decodes any other job's.

A workflow with a guaranteed step is journaled with its graph, as a guaranteed
job of ``WORKFLOW_QUEUE``; its guaranteed steps are guaranteed jobs whose final
REPLY is kept with their done row (``BrokerCore._keep_reply``). After a restart
(``BrokerCore.restore``) the graph is replayed (``resume``): a step that had
ended ends again at once with its kept outcome, never run again; one whose job
was restored is waited for. Plain workflows live in memory only.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from emq_django.broker.effects import Answer, ClientRef, Effect, Outcome
from emq_django.broker.state import Job
from emq_django.protocol.body import encode_failure, encode_result, encode_run_body
from emq_django.protocol.headers import Headers, parse_headers
from emq_django.protocol.workflow import FlowSpec, Spec, StepSpec

log = logging.getLogger(__name__)

CANCELLED = "emq_django.exceptions.Cancelled"
MAX_FINISHED_IDS = 10_000  # ids of ended workflows kept: a resent one is not run again
BODY, ON_ERROR = -1, -2  # a chord's callback and error handler, as a child index

StartStep = Callable[[bytes, str, Headers, bytes, ClientRef | None, float], None]
CancelJob = Callable[[bytes, float], str]
Emit = Callable[[Effect], None]
# a workflow's end: (its job, the REPLY body, the outcome, now)
Finish = Callable[[Job, bytes, Outcome, float], None]
# on resuming a workflow: what the journal says of a step, by its job id: None (no
# trace: start it), WAITING (its job was restored: wait for it) or (body, outcome),
# the final outcome it had (never run again)
WAITING = "waiting"
KeptStep = Callable[[bytes], "str | tuple[bytes, Outcome] | None"]


@dataclass(slots=True, eq=False)
class Node:
    spec: Spec
    path: str
    parent: Node | None
    index: int  # its place in its parent: a child's position, BODY or ON_ERROR
    children: list[Node] = field(default_factory=list)
    body: Node | None = None
    on_error: Node | None = None
    state: str = "waiting"  # running, succeeded, failed
    outcomes: list[tuple[bool, Any]] = field(default_factory=list)
    left: int = 0  # group and chord: children (then callbacks) still running
    result: tuple[bool, Any] | None = None  # a chord's callback outcome
    started_at: float = 0.0
    ended_at: float = 0.0


@dataclass(slots=True, eq=False)
class Workflow:
    job: Job  # the workflow's own REQUEST: its id, its client
    root: Node
    started_at: float
    cancelled: bool = False


def build(spec: Spec, path: str, parent: Node | None, index: int) -> Node:
    node = Node(spec, path, parent, index)
    if isinstance(spec, FlowSpec):
        node.children = [build(c, f"{path}.{i}", node, i) for i, c in enumerate(spec.children)]
        if spec.body is not None:
            node.body = build(spec.body, f"{path}.body", node, BODY)
        if spec.on_error is not None:
            node.on_error = build(spec.on_error, f"{path}.on_error", node, ON_ERROR)
    return node


def steps_of(node: Node) -> list[Node]:
    """The step nodes under ``node``, in graph order."""
    if isinstance(node.spec, StepSpec):
        return [node]
    found = [s for c in node.children for s in steps_of(c)]
    for extra in (node.body, node.on_error):
        if extra is not None:
            found.extend(steps_of(extra))
    return found


class WorkflowEngine:
    """The running workflows, and the hooks the core calls."""

    def __init__(
        self, start_step: StartStep, cancel_job: CancelJob, emit: Emit, finish: Finish
    ) -> None:
        self._start_step = start_step
        self._cancel_job = cancel_job
        self._emit = emit  # appends to the core's ``out`` (which the server swaps)
        self._finish_job = finish  # the workflow's REPLY (and journal row), as a job's
        self._kept: KeptStep | None = None  # while a restored workflow is replayed
        self.workflows: dict[bytes, Workflow] = {}
        self.steps: dict[bytes, tuple[Workflow, Node]] = {}  # step job id -> its node
        self.finished: OrderedDict[bytes, None] = OrderedDict()
        self.counts = {"running": 0, "finished": 0, "failed": 0, "cancelled": 0}

    def known(self, workflow_id: bytes) -> bool:
        return workflow_id in self.workflows or workflow_id in self.finished

    def submit(self, job: Job, spec: Spec, now: float) -> None:
        """Start a new workflow (``job``: its REQUEST, already ACKed)."""
        root = build(spec, "root", None, 0)
        wf = self.workflows[job.id] = Workflow(job, root, now)
        self.counts["running"] += 1
        self._start(wf, root, False, None, now)

    def resume(self, job: Job, spec: Spec, now: float, kept: KeptStep) -> None:
        """Take up a workflow restored from the journal: its graph is replayed from
        the start; a step that had ended ends again at once with its kept outcome
        (it never runs again), one whose job was restored is waited for, and the
        others start when their turn comes."""
        self._kept = kept
        try:
            self.submit(job, spec, now)
        finally:
            self._kept = None

    def claim(self, workflow_id: bytes, client: ClientRef) -> bool:
        """A client sent a running workflow again (after a failover): it gets the
        workflow's REPLY. False if the workflow is not running."""
        wf = self.workflows.get(workflow_id)
        if wf is None:
            return False
        wf.job.client = client
        return True

    def cancel(self, workflow_id: bytes, now: float) -> str:
        """No further step starts; running ones are cancelled as jobs are."""
        wf = self.workflows.get(workflow_id)
        if wf is None:
            return "unknown"
        wf.cancelled = True
        for job_id, (owner, _) in list(self.steps.items()):
            if owner is wf:
                self._cancel_job(job_id, now)
        return "cancelled"  # as a workflow: no step starts any more

    def step_ended(
        self, job: Job, body: bytes, outcome: Outcome, more: tuple[bytes, ...], now: float
    ) -> None:
        """A step's job ended for good (succeeded, failed after its retries,
        cancelled, dead-lettered or lost)."""
        wf, node = self.steps.pop(job.id)
        if job.client is not None:
            self._emit(Answer(job.client, job, body, outcome, more))
        self._step_outcome(wf, node, body, outcome, now)

    def _step_outcome(
        self, wf: Workflow, node: Node, body: bytes, outcome: Outcome, now: float
    ) -> None:
        spec = node.spec
        assert isinstance(spec, StepSpec)
        if outcome.failed:
            self._ended(wf, node, False, _error_of(body, outcome, node.path, spec), now)
        else:
            self._ended(wf, node, True, _value_of(body), now)

    # ---- the graph ------------------------------------------------------------------

    def _start(self, wf: Workflow, node: Node, has_input: bool, value: Any, now: float) -> None:
        node.state, node.started_at = "running", now
        spec = node.spec
        if isinstance(spec, StepSpec):
            self._run_step(wf, node, spec, has_input, value, now)
        elif spec.kind == "chain":
            self._start(wf, node.children[0], has_input, value, now)
        else:  # group, chord: every member at once, each with the same input
            node.left = len(node.children)
            node.outcomes = [(False, None)] * node.left
            for child in node.children:
                self._start(wf, child, has_input, value, now)

    def _run_step(
        self, wf: Workflow, node: Node, spec: StepSpec, has_input: bool, value: Any, now: float
    ) -> None:
        args = [value, *spec.args] if has_input and not spec.immutable else spec.args
        try:
            body = encode_run_body(spec.path, spec.callable, args, spec.kwargs)
        except TypeError as exc:  # the previous result nested too deep, say
            error = _error("TypeError", str(exc), node.path, spec)
            self._ended(wf, node, False, error, now)
            return
        job_id = wf.job.id + b"/" + node.path.encode()
        if self._kept is not None:  # replaying a restored workflow
            found = self._kept(job_id)
            if found == WAITING:
                self.steps[job_id] = (wf, node)
                return
            if isinstance(found, tuple):
                self._step_outcome(wf, node, *found, now)
                return
        self.steps[job_id] = (wf, node)
        self._start_step(job_id, spec.queue, parse_headers(spec.headers), body, wf.job.client, now)

    def _ended(self, wf: Workflow, node: Node, ok: bool, value: Any, now: float) -> None:
        node.state, node.ended_at = ("succeeded" if ok else "failed"), now
        parent = node.parent
        if parent is None:
            self._finish(wf, ok, value, now)
            return
        spec = parent.spec
        assert isinstance(spec, FlowSpec)
        if spec.kind == "chain":
            following = node.index + 1
            if not ok or following >= len(parent.children):
                self._ended(wf, parent, ok, value, now)
            elif wf.cancelled:
                self._ended(wf, parent, False, _error(CANCELLED, "the workflow was cancelled"), now)
            else:
                self._start(wf, parent.children[following], True, value, now)
        elif node.index >= 0:
            self._member_ended(wf, parent, node.index, ok, value, now)
        else:
            self._callback_ended(wf, parent, node.index, ok, value, now)

    def _member_ended(
        self, wf: Workflow, parent: Node, index: int, ok: bool, value: Any, now: float
    ) -> None:
        parent.outcomes[index] = (ok, value)
        parent.left -= 1
        if parent.left > 0 or parent.state != "running":
            return
        failures = [v for good, v in parent.outcomes if not good]
        if wf.cancelled:
            self._ended(wf, parent, False, _error(CANCELLED, "the workflow was cancelled"), now)
            return
        if parent.body is None:  # a group: the results in order, or the first error
            if failures:
                self._ended(wf, parent, False, failures[0], now)
            else:
                self._ended(wf, parent, True, [v for _, v in parent.outcomes], now)
            return
        # a chord: each member's value, or {"error": ...} for a failed one
        outcomes = [v if good else {"error": v} for good, v in parent.outcomes]
        handler = parent.on_error if failures else None
        parent.left = 2 if handler is not None else 1
        self._start(wf, parent.body, True, outcomes, now)
        if handler is not None:
            self._start(wf, handler, True, outcomes, now)

    def _callback_ended(
        self, wf: Workflow, parent: Node, index: int, ok: bool, value: Any, now: float
    ) -> None:
        if index == BODY:
            parent.result = (ok, value)
        parent.left -= 1
        if parent.left == 0 and parent.result is not None:
            self._ended(wf, parent, *parent.result, now)

    def _finish(self, wf: Workflow, ok: bool, value: Any, now: float) -> None:
        job = wf.job
        del self.workflows[job.id]
        self.finished[job.id] = None
        if len(self.finished) > MAX_FINISHED_IDS:
            self.finished.popitem(last=False)
        self.counts["running"] -= 1
        if ok:
            self.counts["finished"] += 1
            body, outcome = encode_result(value), Outcome(failed=False)
        else:
            self.counts["cancelled" if wf.cancelled else "failed"] += 1
            kind = str(value.get("type", "Exception"))
            where = value.get("step")
            message = str(value.get("message", ""))
            if where:
                message = f"workflow step {where} ({value.get('task')}) failed: {message}"
            body = encode_failure(kind, message, str(value.get("traceback", "")))
            outcome = Outcome(failed=True, error=kind)
        self._finish_job(job, body, outcome, now)

    def describe(self, workflow_id: bytes) -> dict[str, Any] | None:
        """A running workflow's steps and their states (the monitor's view)."""
        wf = self.workflows.get(workflow_id)
        if wf is None:
            return None
        return {
            "id": workflow_id.decode("utf-8", "replace"),
            "cancelled": wf.cancelled,
            "steps": [
                {"path": n.path, "task": n.spec.task_name, "state": n.state}  # type: ignore[union-attr]
                for n in steps_of(wf.root)
            ],
        }


def _error(kind: str, message: str, path: str = "", spec: StepSpec | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"type": kind, "message": message}
    if spec is not None:
        error["step"], error["task"] = path, spec.task_name
    return error


def _error_of(body: bytes, outcome: Outcome, path: str, spec: StepSpec) -> dict[str, Any]:
    """The step's error as the chord's callback sees it: type, message, step, task."""
    try:
        data = json.loads(body) if body else None
    except (ValueError, RecursionError):  # not JSON: the step's error is its type
        data = None
    found = data.get("error") if isinstance(data, dict) else None
    if isinstance(found, dict):
        error = _error(str(found.get("type", outcome.error)), str(found.get("message", "")))
        if found.get("traceback"):
            error["traceback"] = str(found["traceback"])
    else:
        error = _error(outcome.error or "Error", outcome.lost or "")
    error["step"], error["task"] = path, spec.task_name
    return error


def _value_of(body: bytes) -> Any:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # a peer's reply that is not JSON
        return None
    if isinstance(data, dict) and "value" in data:
        return data["value"]
    return data
