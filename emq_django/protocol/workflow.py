"""The workflow wire form: one REQUEST on the reserved queue ``WORKFLOW_QUEUE``
whose body is the whole graph as JSON (docs/eventmq-wire.md, "Workflows").

``{"workflow": 1, "root": NODE}`` where a NODE is one of
``{"step": {"path", "callable", "queue", "args", "kwargs", "immutable", "headers"}}``,
``{"chain": [NODE, ...]}``, ``{"group": [NODE, ...]}`` or
``{"chord": {"header": [NODE, ...], "body": NODE, "on_error": NODE | null}}``.

Pure: the client checks what it builds with ``check_graph`` before sending, and
the broker parses what it receives with ``parse_workflow``; both raise
``WorkflowError`` (a ``ValueError``) naming what is wrong.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from emq_django.exceptions import ProtocolError
from emq_django.protocol.headers import parse_headers
from emq_django.protocol.limits import REFUSED_BAD_WORKFLOW, check_queue_name

WORKFLOW_QUEUE = "emq.workflow"  # reserved: a REQUEST here is a workflow, not a job
WORKFLOW_VERSION = 1
MAX_WORKFLOW_DEPTH = 8  # chains, groups and chords nested in one another, at most
MAX_WORKFLOW_STEPS = 20_000  # steps (task calls) in one workflow, at most
# bytes of a workflow's id: its steps' ids (``<id>/<path>``, a path up to about 80
# bytes), and their attempt ids after them, stay within the wire's 255-byte ids
MAX_WORKFLOW_ID = 64
KINDS = ("chain", "group", "chord")


class WorkflowError(ValueError):
    """A workflow the broker would refuse: the message says what and where."""


@dataclass(slots=True)
class StepSpec:
    path: str
    callable: str
    queue: str
    headers: bytes
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    immutable: bool = False

    @property
    def task_name(self) -> str:
        return f"{self.path}.{self.callable}"


@dataclass(slots=True)
class FlowSpec:
    kind: str  # "chain", "group" or "chord"
    children: list[StepSpec | FlowSpec]  # a chord's header members
    body: StepSpec | FlowSpec | None = None  # a chord's callback
    on_error: StepSpec | FlowSpec | None = None  # a chord's, run if a member failed


Spec = StepSpec | FlowSpec


def check_workflow_id(msgid: bytes) -> None:
    """Raises ``ProtocolError`` (``bad-workflow``) for an id too long for its steps'."""
    if len(msgid) > MAX_WORKFLOW_ID:
        raise ProtocolError(
            f"a workflow's id is at most {MAX_WORKFLOW_ID} bytes (its steps' ids add their "
            f"path to it); got {len(msgid)}",
            [msgid[:100]],
            REFUSED_BAD_WORKFLOW,
        )


def parse_workflow(body: bytes) -> Spec:
    """The graph of a workflow REQUEST; raises ``ProtocolError`` (code
    ``bad-workflow``) saying what is wrong."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(
            f"a workflow body must be JSON: {exc}", [body[:200]], REFUSED_BAD_WORKFLOW
        ) from None
    try:
        if not isinstance(data, dict) or data.get("workflow") != WORKFLOW_VERSION:
            raise WorkflowError(
                f'a workflow body is {{"workflow": {WORKFLOW_VERSION}, "root": ...}}'
            )
        counter = [0]
        return _node(data.get("root"), "root", 1, counter)
    except WorkflowError as exc:
        raise ProtocolError(str(exc), [body[:200]], REFUSED_BAD_WORKFLOW) from None


def steps_in(spec: Spec) -> list[StepSpec]:
    """The workflow's steps, in graph order."""
    if isinstance(spec, StepSpec):
        return [spec]
    found: list[StepSpec] = []
    for child in (*spec.children, spec.body, spec.on_error):
        if child is not None:
            found.extend(steps_in(child))
    return found


def step_queues(spec: Spec) -> set[str]:
    """The queues the workflow's steps go to."""
    return {step.queue for step in steps_in(spec)}


def guaranteed(spec: Spec) -> bool:
    """Whether any step is guaranteed: then the broker journals the workflow."""
    return any(b"guarantee" in step.headers.split(b",") for step in steps_in(spec))


def check_graph(graph: dict[str, Any]) -> Spec:
    """The client's check of a graph it built; raises ``WorkflowError``."""
    return _node(graph, "root", 1, [0])


def _node(data: Any, where: str, depth: int, counter: list[int]) -> Spec:
    if not isinstance(data, dict) or len(data) != 1:
        raise WorkflowError(f"{where}: a node is one of step, chain, group, chord")
    ((kind, value),) = data.items()
    if kind == "step":
        counter[0] += 1
        if counter[0] > MAX_WORKFLOW_STEPS:
            raise WorkflowError(f"a workflow has at most {MAX_WORKFLOW_STEPS} steps")
        return _step(value, where)
    if kind not in KINDS:
        raise WorkflowError(f"{where}: unknown node kind {kind!r}")
    if depth > MAX_WORKFLOW_DEPTH:
        raise WorkflowError(
            f"{where}: the workflow nests deeper than {MAX_WORKFLOW_DEPTH} levels "
            "of chain, group and chord"
        )
    if kind == "chord":
        return _chord(value, where, depth, counter)
    if not isinstance(value, list) or not value:
        raise WorkflowError(f"{where}: an empty {kind}: give it at least one signature")
    children = [_node(c, f"{where}.{i}", depth + 1, counter) for i, c in enumerate(value)]
    return FlowSpec(kind, children)


def _chord(value: Any, where: str, depth: int, counter: list[int]) -> FlowSpec:
    if not isinstance(value, dict):
        raise WorkflowError(f"{where}: a chord is {{'header': [...], 'body': ...}}")
    header = value.get("header")
    if not isinstance(header, list) or not header:
        raise WorkflowError(f"{where}: a chord with an empty header: give it members")
    if value.get("body") is None:
        raise WorkflowError(f"{where}: a chord without a callback (its body)")
    children = [_node(c, f"{where}.{i}", depth + 1, counter) for i, c in enumerate(header)]
    body = _node(value["body"], f"{where}.body", depth + 1, counter)
    on_error = value.get("on_error")
    handler = None if on_error is None else _node(on_error, f"{where}.on_error", depth + 1, counter)
    return FlowSpec("chord", children, body, handler)


def _step(value: Any, where: str) -> StepSpec:
    if not isinstance(value, dict):
        raise WorkflowError(f"{where}: a step is an object")
    path, name, queue = value.get("path"), value.get("callable"), value.get("queue")
    if not isinstance(path, str) or not path or not isinstance(name, str) or not name:
        raise WorkflowError(f"{where}: a step needs a 'path' and a 'callable' (strings)")
    try:
        queue = check_queue_name(queue)
    except (TypeError, ValueError) as exc:
        raise WorkflowError(f"{where}: {exc}") from None
    if queue == WORKFLOW_QUEUE:
        raise WorkflowError(f"{where}: {WORKFLOW_QUEUE!r} is reserved for workflows")
    args, kwargs = value.get("args", []), value.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise WorkflowError(f"{where}: 'args' is a list and 'kwargs' an object")
    headers = value.get("headers", "")
    if not isinstance(headers, str):
        raise WorkflowError(f"{where}: 'headers' is a string (an eMQP headers frame)")
    raw = headers.encode()
    try:
        parsed = parse_headers(raw)
    except ProtocolError as exc:
        raise WorkflowError(f"{where}: {exc}") from None
    if parsed.run_after:
        raise WorkflowError(f"{where}: a step cannot have a countdown or an eta")
    return StepSpec(path, name, queue, raw, args, kwargs, bool(value.get("immutable", False)))
