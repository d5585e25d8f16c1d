"""A sample producer: a steady mix of the demo tasks, for `make demo`."""

from __future__ import annotations

import itertools
import logging
import random
import threading
from dataclasses import dataclass

from emq_django.exceptions import BrokerUnavailable, EmqError, TaskFailed
from project.demo import tasks

logger = logging.getLogger(__name__)

RECIPIENTS = ("ada@example.com", "grace@example.com", "linus@example.com")


@dataclass(frozen=True)
class ProducerConfig:
    rate: float = 4.0  # jobs per second
    count: int = 0  # stop after this many rounds; 0 runs until stopped
    get_every: int = 10  # every Nth round waits for an `add` result
    backoff: float = 2.0  # seconds to wait after the broker did not answer


class DemoProducer:
    """Sends one job per round until `stop()` is called or `count` rounds ran."""

    def __init__(self, config: ProducerConfig) -> None:
        self.config = config
        self._stopped = threading.Event()
        self._random = random.Random()

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> int:
        """Returns the number of rounds that got through to the broker."""
        self._schedule_tick()
        sent = 0
        interval = 1.0 / self.config.rate
        rounds = itertools.count(1) if not self.config.count else range(1, self.config.count + 1)
        for n in rounds:
            if self._stopped.is_set():
                break
            pause = interval
            try:
                self.send_one(n)
                sent += 1
            except BrokerUnavailable as exc:
                logger.warning(
                    "broker unavailable, retrying in %.0f s: %s", self.config.backoff, exc
                )
                pause = self.config.backoff
            except TaskFailed as exc:
                logger.info("task failed as expected: %s: %s", exc.type, exc.message)
            except EmqError as exc:
                logger.warning("round %d: %s: %s", n, type(exc).__name__, exc)
            self._stopped.wait(pause)
        logger.info("producer stopped after %d rounds", sent)
        return sent

    def _schedule_tick(self) -> None:
        """A schedule for the demo's scheduler: ``tick`` every 10 s (kept in the DB)."""
        import emq_django as emq

        try:
            emq.schedule(tasks.tick, every=10, name="demo-tick")
        except EmqError as exc:
            logger.warning("could not schedule the demo tick: %s", exc)

    def send_one(self, n: int) -> None:
        if n % self.config.get_every == 0:
            x, y = self._random.randint(0, 99), self._random.randint(0, 99)
            result = tasks.add.delay(x, y).get(timeout=10)
            logger.info("add(%d, %d) = %s", x, y, result)
            return
        choice = self._random.random()
        if choice < 0.35:
            tasks.add.delay(self._random.randint(0, 99), self._random.randint(0, 99))
        elif choice < 0.65:
            to = self._random.choice(RECIPIENTS)
            tasks.send_email.delay(to, f"demo message {n}")
        elif choice < 0.85:
            tasks.noop.delay()
        elif choice < 0.95:
            tasks.slow.delay(round(self._random.uniform(0.1, 1.5), 2))
        else:
            tasks.fail.delay(f"planned failure in round {n}")
