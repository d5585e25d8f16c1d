"""Result handles returned by ``delay()`` and ``apply_async()``."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from emq_django.exceptions import ResultUnavailable, TaskFailed, type_name

if TYPE_CHECKING:
    from emq_django.client import Client


class Result:
    """A job's handle: ``.id`` and ``.get(timeout=)``."""

    def __init__(
        self, job_id: str, task_name: str, *, reply: bool = True, client: Client | None = None
    ) -> None:
        self.id = job_id
        self.task_name = task_name
        self.reply = reply
        self._client = client
        self._done = False
        self._value: Any = None
        self._error: TaskFailed | None = None

    def __repr__(self) -> str:
        return f"<Result {self.id} of {self.task_name}>"

    def get(self, timeout: float | None = 30.0) -> Any:
        """The task's return value. Raises ``TaskFailed`` if it raised,
        ``ResultTimeout`` if no result came within ``timeout`` seconds,
        ``ResultUnavailable`` if it was sent without ``reply``, and
        ``JobRefused`` if the broker refused it."""
        if not self._done:
            if not self.reply:
                raise ResultUnavailable(
                    f"job {self.id} ({self.task_name}) was sent with "
                    "reply=False, so no result comes back"
                )
            from emq_django.client import get_client

            client = self._client or get_client()
            reply = client.wait_reply(self.id.encode(), timeout)
            self._settle(reply.body)
        if self._error is not None:
            raise self._error
        return self._value

    def ready(self) -> bool:
        """True once the result has arrived (never blocks)."""
        if not self._done and self.reply:
            from emq_django.client import get_client

            client = self._client or get_client()
            reply = client.poll_reply(self.id.encode())
            if reply is not None:
                self._settle(reply.body)
        return self._done

    def _settle(self, body: bytes) -> None:
        self._value, self._error = decode_reply_body(body)
        self._done = True


def decode_reply_body(body: bytes) -> tuple[Any, TaskFailed | None]:
    """(value, None) or (None, TaskFailed) from a REPLY body."""
    try:
        data = json.loads(body)
    except ValueError:
        return None, TaskFailed("ProtocolError", f"reply body is not JSON: {body[:100]!r}")
    if isinstance(data, dict) and "error" in data and isinstance(data["error"], dict):
        err = data["error"]
        return None, TaskFailed(
            str(err.get("type", "Exception")),
            str(err.get("message", "")),
            str(err.get("traceback", "")),
        )
    if isinstance(data, dict) and "value" in data:
        return data["value"], None
    return data, None  # a peer that replies with a bare value


class EagerResult(Result):
    """The result of a task run in-process under ``EMQ_EAGER``."""

    def __init__(
        self, task_name: str, *, value: Any = None, error: BaseException | None = None
    ) -> None:
        import uuid

        super().__init__(uuid.uuid4().hex, task_name)
        self._done = True
        self._value = value
        if error is not None:
            import traceback

            tb = "".join(traceback.format_exception(error))
            self._error = TaskFailed(type_name(error), str(error), tb)
