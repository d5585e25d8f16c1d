"""One exception hierarchy: every emq error is an EmqError; WorkerLost is a real class."""

from __future__ import annotations

import inspect

import emq_django.exceptions as exceptions_module
from emq_django.broker import core
from emq_django.broker.journal import JournalError
from emq_django.exceptions import Cancelled, EmqError, TaskFailed, WorkerLost
from emq_django.handles import decode_reply_body
from emq_django.scheduler.cron import CronError
from emq_django.worker import jobmanager, slots


def test_every_exception_class_is_an_emq_error() -> None:
    classes = [
        cls
        for _, cls in inspect.getmembers(exceptions_module, inspect.isclass)
        if issubclass(cls, BaseException) and cls.__module__ == exceptions_module.__name__
    ]
    assert classes and all(issubclass(cls, EmqError) for cls in classes)
    assert issubclass(JournalError, EmqError)
    assert issubclass(CronError, EmqError) and issubclass(CronError, ValueError)


def test_the_worker_lost_status_names_the_worker_lost_class() -> None:
    assert core.WORKER_LOST == slots.WORKER_LOST == jobmanager.WORKER_LOST == WorkerLost.TYPE
    assert issubclass(WorkerLost, TaskFailed)


def test_a_reply_of_a_lost_worker_raises_worker_lost() -> None:
    body = b'{"error": {"type": "emq_django.exceptions.WorkerLost", "message": "killed"}}'
    _, error = decode_reply_body(body)
    assert isinstance(error, WorkerLost) and error.message == "killed"
    _, error = decode_reply_body(b'{"error": {"type": "emq_django.exceptions.Cancelled"}}')
    assert isinstance(error, Cancelled)
    _, error = decode_reply_body(b'{"error": {"type": "ValueError", "message": "x"}}')
    assert type(error) is TaskFailed
