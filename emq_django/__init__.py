"""emq-django: a task queue for Django on ZeroMQ.

``import emq_django as emq``, then ``@emq.task(queue="email")`` and
``send_email.delay(...)``.
"""

from emq_django.exceptions import (
    BatchUnacknowledged,
    BrokerUnavailable,
    Cancelled,
    EmqError,
    EventsExpired,
    HandshakeRefused,
    JobRefused,
    JobsRefused,
    PartialsLost,
    ProtocolError,
    PublishUnconfirmed,
    QueueFull,
    ResultTimeout,
    ResultUnavailable,
    Retry,
    SoftTimeLimitExceeded,
    TaskFailed,
    TaskNotFound,
    WorkerLost,
)
from emq_django.handles import Result, result
from emq_django.pubsub import (
    asubscribe,
    publish,
    publish_many,
    publish_on_commit,
    subscribe,
    wait_published,
)
from emq_django.scheduler.api import periodic, schedule, unschedule
from emq_django.streaming import partial
from emq_django.task import Task, task
from emq_django.workflows import (
    Signature,
    StepEvent,
    WorkflowResult,
    chain,
    chord,
    group,
    signature,
)

__all__ = [
    "BatchUnacknowledged",
    "BrokerUnavailable",
    "Cancelled",
    "EmqError",
    "EventsExpired",
    "HandshakeRefused",
    "PublishUnconfirmed",
    "JobRefused",
    "JobsRefused",
    "PartialsLost",
    "ProtocolError",
    "QueueFull",
    "Result",
    "ResultTimeout",
    "ResultUnavailable",
    "Retry",
    "Signature",
    "SoftTimeLimitExceeded",
    "StepEvent",
    "Task",
    "TaskFailed",
    "TaskNotFound",
    "WorkerLost",
    "WorkflowResult",
    "asubscribe",
    "chain",
    "chord",
    "group",
    "partial",
    "periodic",
    "publish",
    "publish_many",
    "publish_on_commit",
    "wait_published",
    "result",
    "schedule",
    "signature",
    "subscribe",
    "task",
    "unschedule",
]
__version__ = "0.1.0"
