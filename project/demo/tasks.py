"""Sample tasks for `make demo`: one of each outcome a queue has to handle."""

import time
from typing import Any

import emq_django as emq


@emq.task(queue="default")
def add(x: float, y: float) -> float:
    return x + y


@emq.task(queue="email", retries=2, timeout=30)
def send_email(to: str, subject: str) -> dict[str, Any]:
    """Pretends to send an email: a few milliseconds of I/O."""
    time.sleep(0.005)
    return {"to": to, "subject": subject, "status": "sent"}


@emq.task(queue="default")
def noop() -> None:
    return None


@emq.task(queue="default")
def fail(message: str = "boom") -> None:
    raise ValueError(message)


@emq.task(queue="default", timeout=5)
def slow(seconds: float = 1.0) -> float:
    time.sleep(seconds)
    return seconds


@emq.task(queue="default")
def tick() -> str:
    """Scheduled every 10 s by the demo producer (`emq.schedule`), run by `emq_scheduler`."""
    return time.strftime("%H:%M:%S")
