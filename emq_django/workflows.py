"""Signatures and workflows: ``task.s()``, ``emq.chain``, ``emq.group``, ``emq.chord``.

A workflow is sent as one REQUEST with its whole graph (``protocol/workflow.py``)
and kept by the broker (``broker/workflows.py``), which starts each step when
the steps before it have ended. Semantics: docs/features/workflows.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from emq_django import registry
from emq_django.exceptions import PartialsLost, TaskFailed
from emq_django.handles import Result, _process_client, decode_reply_body
from emq_django.protocol.body import encode_run_body
from emq_django.protocol.headers import format_headers
from emq_django.protocol.limits import MAX_TIMEOUT, check_count, check_queue_name, check_seconds
from emq_django.protocol.workflow import (
    MAX_WORKFLOW_ID,
    WORKFLOW_QUEUE,
    WORKFLOW_VERSION,
    check_graph,
    guaranteed,
)

_OPTIONS = ("queue", "retries", "timeout", "soft_timeout", "guarantee")
_NOT_IN_WORKFLOWS = {
    "countdown": "a step starts when the steps before it end: it takes no countdown",
    "eta": "a step starts when the steps before it end: it takes no eta",
    "reply": "a workflow's steps always reply to the workflow",
    "on_commit": "send the whole workflow on commit instead (transaction.on_commit)",
}


class Signature:
    """A task with its arguments and options, not sent yet (``task.s()``,
    ``task.si()``, ``emq.signature(name, ...)``). JSON-serialisable
    (``to_dict()`` / ``Signature.from_dict()``). In a chain, a signature gets
    the previous step's result as its first argument unless it is immutable."""

    def __init__(
        self,
        task_name: str,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        options: Mapping[str, Any] | None = None,
        immutable: bool = False,
    ) -> None:
        task = registry.get(task_name)  # TaskNotFound for an unregistered one
        self.task = task
        self.args = list(args)
        self.kwargs = dict(kwargs or {})
        self.immutable = bool(immutable)
        self.options: dict[str, Any] = {}
        self.path, self.callable = _where(task)
        encode_run_body(self.path, self.callable, self.args, self.kwargs)  # TypeError
        self.set(**(options or {}))

    @property
    def name(self) -> str:
        return str(self.task.name)

    def __repr__(self) -> str:
        mark = "si" if self.immutable else "s"
        return f"<Signature {self.name}.{mark}({self.args!r}, {self.kwargs!r})>"

    def set(self, **options: Any) -> Signature:
        """Set the step's ``queue``, ``retries``, ``timeout``, ``soft_timeout`` or ``guarantee``
        (as ``apply_async`` takes them); returns the signature. Raises
        ``ValueError``/``TypeError`` for an option a step cannot have or a bad value."""
        for key, value in options.items():
            if key in _NOT_IN_WORKFLOWS:
                raise ValueError(f"{self.name}: {key}= {_NOT_IN_WORKFLOWS[key]}")
            if key not in _OPTIONS:
                raise TypeError(f"{self.name}: unknown option {key!r}; one of {_OPTIONS}")
            if key == "guarantee":
                if not isinstance(value, bool):
                    raise TypeError(f"{self.name}: guarantee must be True or False")
            elif key == "queue":
                check_queue_name(value)
            elif key == "retries":
                check_count("retries", value)
            else:
                check_seconds(key, value, MAX_TIMEOUT)
            self.options[key] = value
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.name,
            "args": self.args,
            "kwargs": self.kwargs,
            "options": dict(self.options),
            "immutable": self.immutable,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Signature:
        return cls(
            data["task"],
            data.get("args", ()),
            data.get("kwargs"),
            options=data.get("options"),
            immutable=data.get("immutable", False),
        )

    def node(self) -> dict[str, Any]:
        """The step as the workflow's graph carries it (protocol/workflow.py)."""
        task, opts = self.task, self.options
        timeout = opts.get("timeout", task.timeout)
        soft = opts.get("soft_timeout", getattr(task, "soft_timeout", 0))
        headers = format_headers(
            reply_requested=True,
            guarantee=opts.get("guarantee", task.guarantee),
            retry_count=opts.get("retries", task.retries),
            timeout=timeout,
            task=task.name,
            stream=True,
            extra=(("soft-timeout", f"{soft:g}"),) if soft else (),
        )
        step = {
            "path": self.path,
            "callable": self.callable,
            "queue": opts.get("queue", task.queue),
            "args": self.args,
            "kwargs": self.kwargs,
            "immutable": self.immutable,
            "headers": headers.decode(),
        }
        return {"step": step}

    def delay(self, *args: Any, **kwargs: Any) -> Result:
        """Send it as a plain job, ``args`` before its own."""
        merged = {**self.kwargs, **kwargs}
        return self.task.apply_async((*args, *self.args), merged, **self.options)


def _where(task: registry.Task) -> tuple[str, str]:
    """The task's module path and callable, as the run body names them."""
    path, name = getattr(task, "path", None), getattr(task, "callable", None)
    if isinstance(path, str) and isinstance(name, str):
        return path, name
    path, _, name = task.name.rpartition(".")
    return path, name


def signature(
    task_name: str,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    **options: Any,
) -> Signature:
    """A signature by task name; raises ``TaskNotFound`` if no task has it."""
    return Signature(task_name, args, kwargs, options=options)


class Workflow:
    """What ``chain``, ``group`` and ``chord`` make: send it with ``delay()``."""

    def node(self) -> dict[str, Any]:
        raise NotImplementedError

    def graph(self) -> dict[str, Any]:
        """The workflow's body: raises ``WorkflowError`` (a ``ValueError``) for a
        graph the broker would refuse (nested too deep, too many steps)."""
        root = self.node()
        check_graph(root)
        return {"workflow": WORKFLOW_VERSION, "root": root}

    def delay(self) -> WorkflowResult:
        return self.apply_async()

    def apply_async(self, *, job_id: str | None = None) -> WorkflowResult:
        """Send the workflow; returns its ``WorkflowResult``. Raises ``WorkflowError``
        for a graph the broker would refuse, ``JobRefused`` when it refuses it,
        ``BrokerUnavailable`` when it does not answer, and ``ImproperlyConfigured``
        under ``EMQ_EAGER`` (workflows need a broker: in tests, use
        ``emq_django.testing.InMemoryBroker``)."""
        from django.core.exceptions import ImproperlyConfigured

        from emq_django.client import get_client
        from emq_django.conf import cached_settings

        if job_id is not None and len(str(job_id).encode("utf-8", "replace")) > MAX_WORKFLOW_ID:
            raise ValueError(
                f"a workflow's job_id is at most {MAX_WORKFLOW_ID} bytes: its steps' ids "
                "add their path to it"
            )
        graph = self.graph()
        body = json.dumps(graph, separators=(",", ":"), ensure_ascii=False).encode()
        settings = cached_settings()
        if settings.EAGER:
            raise ImproperlyConfigured(
                "workflows are kept by the broker and do not run under EMQ_EAGER: "
                "in tests, use emq_django.testing.InMemoryBroker"
            )
        if len(body) > settings.MAX_BODY_BYTES:
            raise ValueError(
                f"the workflow's graph is {len(body)} bytes; the most is "
                f"{settings.MAX_BODY_BYTES} (EMQ_MAX_BODY_BYTES)"
            )
        client = get_client()
        # kept in the broker's journal when any step is guaranteed
        kept = guaranteed(check_graph(graph["root"]))
        headers = format_headers(reply_requested=True, guarantee=kept, task=WORKFLOW_QUEUE)
        wid = client.send(WORKFLOW_QUEUE, headers, body, confirm=True, job_id=job_id)
        return WorkflowResult(wid, self.node(), client)


def _node_of(item: Signature | Workflow) -> dict[str, Any]:
    if not isinstance(item, Signature | Workflow):
        raise TypeError(
            f"a workflow takes signatures (task.s(...)) and workflows, got {type(item).__name__}"
        )
    return item.node()


class chain(Workflow):  # noqa: N801 - named as Celery's canvas names it
    """Steps one after another: each gets the previous one's result as its first
    argument (unless immutable, ``task.si()``); the result is the last one's."""

    def __init__(self, *steps: Signature | Workflow) -> None:
        if not steps:
            raise ValueError("an empty chain: give it at least one signature")
        self.steps = list(steps)
        for step in self.steps:
            _node_of(step)

    def node(self) -> dict[str, Any]:
        return {"chain": [_node_of(s) for s in self.steps]}


class group(Workflow):  # noqa: N801
    """Members run in parallel; the result is the list of their results, in order."""

    def __init__(self, *members: Signature | Workflow | Iterable[Signature | Workflow]) -> None:
        if len(members) == 1 and not isinstance(members[0], Signature | Workflow):
            members = tuple(members[0])
        if not members:
            raise ValueError("an empty group: give it at least one signature")
        self.members: list[Signature | Workflow] = list(members)  # type: ignore[arg-type]
        for member in self.members:
            _node_of(member)

    def node(self) -> dict[str, Any]:
        return {"group": [_node_of(m) for m in self.members]}


class chord(Workflow):  # noqa: N801
    """A group, then ``callback`` once every member has ended, with the list of
    their outcomes (a failed member's is ``{"error": {...}}``); ``on_error`` runs
    once, with the same list, if any member failed."""

    def __init__(
        self,
        header: group | Iterable[Signature | Workflow],
        callback: Signature | Workflow | None = None,
        *,
        on_error: Signature | Workflow | None = None,
    ) -> None:
        self.header = header if isinstance(header, group) else group(list(header))
        if callback is None:
            raise ValueError("a chord without a callback: use a group, or give the callback")
        _node_of(callback)
        if on_error is not None:
            _node_of(on_error)
        self.callback = callback
        self.on_error = on_error

    def node(self) -> dict[str, Any]:
        body = {
            "header": [_node_of(m) for m in self.header.members],
            "body": _node_of(self.callback),
            "on_error": None if self.on_error is None else _node_of(self.on_error),
        }
        return {"chord": body}


class WorkflowResult(Result):
    """A sent workflow: ``get()`` returns its final value or raises the
    ``TaskFailed`` of the step that ended it (its message names the step);
    ``steps`` are the handles of its steps, in graph order; ``cancel()`` stops it."""

    def __init__(self, workflow_id: str, root: dict[str, Any], client: Any) -> None:
        super().__init__(workflow_id, "workflow", client=client)
        self._paths = list(_step_paths(root, "root"))

    def __repr__(self) -> str:
        return f"<WorkflowResult {self.id}>"

    @property
    def steps(self) -> list[Result]:
        """Each step's handle (``get()`` waits for that step's outcome); the id of a
        step is ``<workflow id>/<its path in the graph>``."""
        return [
            Result(f"{self.id}/{path}", name, client=self._client) for path, name in self._paths
        ]

    def stream(self, timeout: float | None = 30.0) -> Iterator[Any]:
        """Yield a ``StepEvent`` per step's start, partial result and end, as they
        reach this client, then the workflow's final value (as ``get()`` returns
        it, or raises). ``timeout``: the longest wait for each next one
        (``ResultTimeout``); ``PartialsLost`` as ``Result.stream()`` raises it.
        Once the result is in, a stream yields the final value only."""
        if not self._done:
            yield from self._stream_steps(timeout)
        yield self.get()

    def _stream_steps(self, timeout: float | None) -> Iterator[StepEvent]:
        client = self._client or _process_client()
        own = self._msgid_bytes()
        steps = {f"{self.id}/{path}".encode(): (path, name) for path, name in self._paths}
        # ranked in graph order (a step's after those it waits for); the workflow's
        # own REPLY comes after its steps'
        waiting = {msgid: rank for rank, msgid in enumerate(steps)}
        seen: dict[bytes, tuple[int, int]] = {}  # a step's (attempt, seq) streamed
        while True:
            msgid, item = client.next_streamed_of(waiting, timeout, own)
            if msgid == own:
                if not isinstance(item, tuple):  # the workflow's REPLY: it has ended
                    self._settle(item.body)
                    return
                continue  # a workflow sends no partial of its own
            path, name = steps[msgid]
            if msgid not in seen:
                seen[msgid] = (0, 0)
                yield StepEvent("start", path, name)
            if not isinstance(item, tuple):
                del waiting[msgid]
                value, error = decode_reply_body(item.body)
                yield StepEvent("end", path, name, value, error, seen[msgid][0])
                continue
            attempt, seq, body = item
            last_attempt, last_seq = seen[msgid]
            if attempt < last_attempt:
                continue  # a late partial of an attempt that was retried
            if attempt > last_attempt:
                last_seq = 0  # a retry: its partials start again
            seen[msgid] = (attempt, seq)
            if seq != last_seq + 1:
                raise PartialsLost(
                    f"{seq - last_seq - 1} partial results of workflow step {path} ({name}, "
                    f"attempt {attempt}) went missing before this one"
                )
            yield StepEvent("partial", path, name, decode_reply_body(body)[0], None, attempt)

    def cancel(self) -> bool:
        """No further step starts; running steps are cancelled as jobs are (their
        worker process is killed). ``get()`` then raises ``Cancelled``."""
        return bool(self._client.cancel(self.id))  # type: ignore[union-attr]


def _step_paths(node: dict[str, Any], path: str) -> Iterator[tuple[str, str]]:
    ((kind, value),) = node.items()
    if kind == "step":
        yield path, f"{value['path']}.{value['callable']}"
    elif kind == "chord":
        for i, member in enumerate(value["header"]):
            yield from _step_paths(member, f"{path}.{i}")
        yield from _step_paths(value["body"], f"{path}.body")
        if value.get("on_error") is not None:
            yield from _step_paths(value["on_error"], f"{path}.on_error")
    else:
        for i, child in enumerate(value):
            yield from _step_paths(child, f"{path}.{i}")


@dataclass(frozen=True, slots=True)
class StepEvent:
    """What ``WorkflowResult.stream()`` yields before the final value: ``kind`` is
    ``"start"`` (the first this client hears of the step: the broker sends no
    message when a step's job starts), ``"partial"`` (a partial result, in
    ``value``) or ``"end"`` (the step's outcome: ``value``, or ``error``, the
    ``TaskFailed`` it ended with); ``step`` is its path (``root.1``), ``task`` its
    task's name, ``attempt`` the attempt a partial came from."""

    kind: Literal["start", "partial", "end"]
    step: str
    task: str
    value: Any = None
    error: TaskFailed | None = None
    attempt: int = 0
