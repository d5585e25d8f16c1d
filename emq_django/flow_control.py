"""Flow control, the sending side (docs/features/flow-control.md; the broker's side
is broker/flow.py): ``@emq.task(rate_limit="100/s", max_concurrency=N,
concurrency_key=...)`` and ``apply_async(concurrency_key="customer-42")``.

The task's rate limit and ``max_concurrency`` go in its headers (``rate-limit``,
``max-concurrency``) with every job; a concurrency key (a str, or a callable that
derives it from the call's arguments) in ``concurrency-key``. Bad values raise
``TypeError``/``ValueError`` here, at the call site.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from emq_django.protocol.flow import check_concurrency_key, check_max_concurrency, parse_rate

KeyOption = str | Callable[..., str] | None


class FlowOptions:
    """A task's flow control options, checked."""

    __slots__ = ("rate_limit", "max_concurrency", "concurrency_key")

    def __init__(self, rate_limit: Any, max_concurrency: Any, concurrency_key: Any) -> None:
        if rate_limit is not None:
            parse_rate(rate_limit)
        if max_concurrency is not None:
            check_max_concurrency(max_concurrency)
        if concurrency_key is not None:
            if not callable(concurrency_key):
                check_concurrency_key(concurrency_key)
            if max_concurrency is None:
                raise ValueError("concurrency_key needs max_concurrency (how many per key)")
        self.rate_limit: str | None = rate_limit
        self.max_concurrency: int | None = max_concurrency
        self.concurrency_key: KeyOption = concurrency_key

    @property
    def per_call(self) -> bool:
        """Each call has its own key (a callable): ``delay()`` goes the way of
        ``apply_async()``."""
        return callable(self.concurrency_key)

    def header_options(self) -> dict[str, Any]:
        """The task's own flow headers, as ``format_headers`` takes them."""
        key = self.concurrency_key
        return {
            "rate_limit": self.rate_limit or "",
            "max_concurrency": self.max_concurrency or 0,
            "concurrency_key": key if isinstance(key, str) else "",
        }

    def key_for(
        self, key: Any, args: Sequence[Any], kwargs: Mapping[str, Any] | None
    ) -> str | None:
        """The concurrency key of one call: ``apply_async``'s ``key`` if given, else
        the task's callable's (None when the task's headers carry it, or it has
        none). Raises ``TypeError``/``ValueError``."""
        if key is not None:
            if self.max_concurrency is None:
                raise ValueError(
                    "concurrency_key needs a task with max_concurrency (how many per key)"
                )
            return check_concurrency_key(key)
        if callable(self.concurrency_key):
            return check_concurrency_key(self.concurrency_key(*args, **(kwargs or {})))
        return None


def with_concurrency_key(headers: bytes, key: str) -> bytes:
    """``headers`` (which have ``max-concurrency``) with this call's key; one the
    task's headers had is replaced."""
    items = [i for i in headers.split(b",") if not i.startswith(b"concurrency-key:")]
    return b",".join([*items, b"concurrency-key:" + key.encode()])
