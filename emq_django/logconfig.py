"""Logging: the set-up of the long-running commands (never at import time), and
the structured fields of the log records about jobs.

Every log record about one job carries, in ``extra=`` (so on the ``LogRecord``, for a
JSON formatter or a log shipper): ``job_id`` (the job's id, without its attempt),
``attempt`` (1 for the first attempt), and ``queue`` and ``task`` where the code
that logs knows them ('' where it does not). docs/deployment.md ("Logging").
"""

from __future__ import annotations

import logging
from typing import Any

from emq_django.ids import split_attempt

JOB_FIELDS = ("job_id", "attempt", "queue", "task")


def job_fields(attempt_id: bytes | str, queue: str = "", task: str = "") -> dict[str, Any]:
    """The ``extra=`` of a log record about one job; ``attempt_id`` is a job id or an
    attempt's (``<job id>#2``). Only on logging paths: never per message."""
    raw = attempt_id.encode() if isinstance(attempt_id, str) else bytes(attempt_id)
    job_id, attempt = split_attempt(raw)
    return {"job_id": job_id, "attempt": attempt, "queue": queue, "task": task}


def configure_command_logging(verbosity: int = 1) -> None:
    """Send emq_django's logs to stderr, unless the project's LOGGING already does."""
    logger = logging.getLogger("emq_django")
    level = logging.DEBUG if verbosity >= 2 else logging.INFO if verbosity >= 1 else logging.WARNING
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level)
