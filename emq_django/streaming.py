"""Streamed results: ``emq.partial(value)`` and generator tasks.

A task streams by yielding values (a generator function) or by calling
``emq.partial(value)``: each value goes to the caller at once as a partial
result (``Result.stream()``), and the return value is the final one. Whoever
runs the job (a worker process, or ``EMQ_EAGER``) installs a *sink* for the
job's partials; the sink gets each value already encoded as a REPLY-style body
(``{"value": ...}``). Outside a job (a task called as a plain function)
``partial()`` does nothing.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from emq_django.protocol.body import encode_result

PartialSink = Callable[[bytes], None]

# where the running job's partials go; set by whoever runs the job

partial_sink: ContextVar[PartialSink | None] = ContextVar("emq_partial_sink", default=None)


def partial(value: Any) -> None:
    """Send ``value`` to the job's caller now, as a partial result: its
    ``Result.stream()`` yields it before the task's return value. Raises
    ``TypeError`` when ``value`` is not JSON serializable. Does nothing outside a
    job (a task called directly)."""
    sink = partial_sink.get()
    if sink is not None:
        sink(_encode(value))


def _encode(value: Any) -> bytes:
    try:
        return encode_result(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"a partial result must be JSON serializable: {exc}") from exc


@contextmanager
def partials_to(sink: PartialSink) -> Iterator[None]:
    """Within the block, ``partial()`` and yielded values go to ``sink``."""
    token = partial_sink.set(sink)
    try:
        yield
    finally:
        partial_sink.reset(token)


def run_task(fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """Call ``fn``; a generator it returns is run to its end here: each value it
    yields goes to the current sink (``partial``), and its ``return`` value is the
    result. Exceptions propagate (a partial already sent stays sent)."""
    value = fn(*args, **kwargs)
    if inspect.isgenerator(value):
        return drain(value)
    return value


def drain(gen: Generator[Any, Any, Any]) -> Any:
    """Run a generator task's generator to its end: each value it yields is a
    partial result, its ``return`` value the result."""
    try:
        while True:
            partial(next(gen))
    except StopIteration as stop:
        return stop.value
    finally:
        gen.close()
