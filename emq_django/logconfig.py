"""Logging: the set-up of the long-running commands (never at import time), and
the structured fields of the log records about jobs.

Every log record about one job carries, in ``extra=`` (so on the ``LogRecord``, for a
JSON formatter or a log shipper): ``job_id`` (the job's id, without its attempt),
``attempt`` (1 for the first attempt), and ``queue`` and ``task`` where the code
that logs knows them ('' where it does not). docs/deployment.md ("Logging").
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

from emq_django.ids import split_attempt

JOB_FIELDS = ("job_id", "attempt", "queue", "task")
LOG_FORMATS = ("text", "json")  # EMQ_LOG_FORMAT


def job_fields(attempt_id: bytes | str, queue: str = "", task: str = "") -> dict[str, Any]:
    """The ``extra=`` of a log record about one job; ``attempt_id`` is a job id or an
    attempt's (``<job id>#2``). Only on logging paths: never per message."""
    raw = attempt_id.encode() if isinstance(attempt_id, str) else bytes(attempt_id)
    job_id, attempt = split_attempt(raw)
    return {"job_id": job_id, "attempt": attempt, "queue": queue, "task": task}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC, ISO 8601), ``level``, ``logger``,
    ``pid``, ``message``, the job's fields where the record has them
    (``JOB_FIELDS``), and ``exception`` (the formatted traceback) when it has one."""

    def format(self, record: logging.LogRecord) -> str:
        created = dt.datetime.fromtimestamp(record.created, dt.UTC)
        doc: dict[str, Any] = {
            "time": created.isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        for name in JOB_FIELDS:
            if name in record.__dict__:
                doc[name] = record.__dict__[name]
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exception"] = record.exc_text
        return json.dumps(doc, default=str, ensure_ascii=False)


def configure_command_logging(verbosity: int = 1, log_format: str = "text") -> None:
    """Send emq_django's logs to stderr, unless the project's LOGGING already does.
    ``log_format`` (``EMQ_LOG_FORMAT``): ``text`` leaves the lines as they are;
    ``json`` makes every handler of the command's loggers (``emq_django``'s and the
    root's, the project's own included) write one object a line (``JsonFormatter``)."""
    logger = logging.getLogger("emq_django")
    level = logging.DEBUG if verbosity >= 2 else logging.INFO if verbosity >= 1 else logging.WARNING
    root = logging.getLogger()
    if not logger.handlers and not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level)
    if log_format == "json":
        formatter = JsonFormatter()
        loggers = [
            root,
            *(lg for lg in root.manager.loggerDict.values() if isinstance(lg, logging.Logger)),
        ]
        for each in loggers:
            for known in each.handlers:
                known.setFormatter(formatter)
