"""Running one job: look up the registered task, call it, encode the outcome."""

from __future__ import annotations

import logging
import traceback

from django.db import close_old_connections

from emq_django import registry
from emq_django.exceptions import ProtocolError, type_name
from emq_django.protocol.body import decode_run_body, encode_failure, encode_result

log = logging.getLogger(__name__)

STATUS_OK = b"ok,ready"
STATUS_FAILED = b"failed,ready"


def failure(exc: BaseException, tb: str = "") -> bytes:
    return encode_failure(type_name(exc), str(exc), tb)


def execute(body: bytes, job_id: bytes = b"") -> tuple[bytes, bool]:
    """Run the job in ``body``; returns (reply body, failed). Never raises."""
    try:
        spec = decode_run_body(body)
    except ProtocolError as exc:
        log.warning("refused job %s: %s", job_id.decode(errors="replace"), exc.reason)
        return encode_failure("emq_django.exceptions.ProtocolError", exc.reason, ""), True
    task = registry.find(spec.task_name)
    if task is None:
        log.warning(
            "refused job %s: %s is not a registered task; it was not imported",
            job_id.decode(errors="replace"),
            spec.task_name,
        )
        return encode_failure(
            "emq_django.exceptions.TaskNotFound", f"{spec.task_name!r} is not a registered task", ""
        ), True
    # Closing after every job also closes "before" the next one: nothing runs between
    # jobs, and the job manager closes all connections before it forks.
    try:
        value = task.fn(*spec.args, **spec.kwargs)
    except Exception as exc:
        log.info(
            "job %s (%s) failed: %s: %s",
            job_id.decode(errors="replace"),
            task.name,
            type_name(exc),
            exc,
        )
        return failure(exc, traceback.format_exc()), True
    finally:
        close_old_connections()
    try:
        return encode_result(value), False
    except (TypeError, ValueError) as exc:
        err = TypeError(f"the result of {task.name} is not JSON serializable: {exc}")
        return failure(err), True
