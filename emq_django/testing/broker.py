"""The in-memory broker: the real broker core and the real job runner, in this
process, on a clock the test moves.

Nothing runs in the background: jobs run when the test asks for a result
(``get()``, ``stream()``, ``ready()``) or calls ``run()`` / ``advance()``, in
the order the core dispatches them, one at a time (each queue has one worker
with one slot). A job that waits for the clock (a countdown, an eta, a retry's
backoff) runs once ``advance()`` has moved the clock past its time.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from typing import Any

from emq_django.broker.core import CANCELLED, CANCELLED_UNSTARTED, BrokerCore
from emq_django.broker.effects import Answer, ClientRef, Deliver, Outcome, Refuse
from emq_django.broker.state import BrokerConfig, Job, Peer
from emq_django.exceptions import ProtocolError
from emq_django.protocol.headers import Headers
from emq_django.protocol.workflow import WORKFLOW_QUEUE, parse_workflow, step_queues
from emq_django.testing.client import MemoryClient
from emq_django.worker.execution import run_in_place

log = logging.getLogger(__name__)


class MemoryPort:
    """What the core asks of the port a client or worker came in by."""

    name = "memory"
    acknowledges = True  # an ACK (or a refusal) for every job, as eMQP's
    always_streams = False  # partials go to clients that asked (``stream``)


class _Sink:
    """A running job's partial results, straight to the core (numbered from 1)."""

    __slots__ = ("broker", "peer", "attempt_id", "count")

    def __init__(self, broker: InMemoryBroker, peer: Peer, attempt_id: bytes) -> None:
        self.broker, self.peer, self.attempt_id, self.count = broker, peer, attempt_id, 0

    def __call__(self, body: bytes) -> None:
        self.count += 1
        core = self.broker.core
        core.worker_partial(self.peer, self.attempt_id, body, self.broker.now, seq=self.count)
        self.broker.apply()


class InMemoryBroker:
    """A broker for users' tests: ``install()`` it (or use the ``emq_broker``
    pytest fixture, or ``InMemoryBrokerMixin``), then ``task.delay(...)`` sends
    to it and ``.get()`` runs the job here.

    ``config``: the core's bounds (default: from the ``EMQ_*`` settings, as the
    real broker reads them); ``seed``: the retry backoff's jitter. The clock
    starts at 0 (``now``) and moves only by ``advance()``."""

    def __init__(self, config: BrokerConfig | None = None, *, seed: int | None = 0) -> None:
        if config is None:
            from emq_django.conf import cached_settings

            config = BrokerConfig.from_settings(cached_settings())
        self.now = 0.0
        self.core = BrokerCore(config, self.now, seed=seed)
        # the core's wall clock is this one plus the real time at the start, so that
        # a countdown (sent as a wall time) counts on this clock (MemoryClient)
        self.core.wall_offset = time.time()
        self.port = MemoryPort()
        ref = ClientRef(self.port, b"memory-client")  # type: ignore[arg-type]
        self.client = MemoryClient(self, ref)
        self.workers: dict[str, Peer] = {}  # queue name -> its worker
        self.deliveries: deque[tuple[Peer, Job]] = deque()  # dispatched, not yet run
        self.attempts = 0  # attempts run so far
        self._restore: Any = None

    # ---- installing --------------------------------------------------------------

    def install(self) -> InMemoryBroker:
        """Make this process's client send here (``uninstall()`` undoes it).
        Raises ``ImproperlyConfigured`` when ``EMQ_EAGER`` is on: ``delay()`` would
        run tasks in place and never reach this broker."""
        from django.core.exceptions import ImproperlyConfigured

        from emq_django.client import install_client
        from emq_django.conf import cached_settings

        if cached_settings().EAGER:
            raise ImproperlyConfigured(
                "EMQ_EAGER is on: delay() runs tasks in place and never reaches the "
                "in-memory broker; turn it off for these tests "
                "(@override_settings(EMQ_EAGER=False))"
            )
        if self._restore is None:
            self._restore = install_client(self.client)
        return self

    def uninstall(self) -> None:
        if self._restore is not None:
            self._restore()
            self._restore = None

    def __enter__(self) -> InMemoryBroker:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    # ---- the clock and the work --------------------------------------------------

    def run(self) -> int:
        """Run every job that is ready now, and those they make ready (a retry
        without delay, a job a task sends); returns how many attempts ran."""
        ran = 0
        while self.deliveries:
            peer, job = self.deliveries.popleft()
            self._run(peer, job)
            ran += 1
        return ran

    def advance(self, seconds: float) -> int:
        """Move the clock ``seconds`` ahead, running what comes due on the way, at
        its time and in order (a retry's backoff, a countdown, an eta); returns
        how many attempts ran. Raises ``ValueError`` for a negative ``seconds``."""
        if not seconds >= 0:
            raise ValueError(f"the clock only moves ahead: got {seconds!r} seconds")
        until = self.now + seconds
        ran = self.run()
        # from one due job to the next: the core's other timers (heartbeats, peers'
        # expiry) concern peers that are never silent here, and run at each stop
        while (due := self.core.life.delayed.next_due()) <= until:
            self.now = max(self.now, due)
            self._tick()
            ran += self.run()
        self.now = until
        self._tick()
        return ran + self.run()

    def _tick(self) -> None:
        """The core's timers at ``now``; our workers are alive (they never beat)."""
        for peer in self.workers.values():
            peer.last_seen = self.now
        self.core.on_timer(self.now)
        self.apply()

    # ---- what a test may look at ------------------------------------------------------

    def dead_letters(self) -> list[dict[str, Any]]:
        """The jobs that failed past their retries: dicts with ``id``, ``queue``,
        ``task``, ``attempts``, ``error``, ``died_at``, ``guaranteed``."""
        return self.core.dead_letters(limit=1_000_000)

    def delayed(self) -> int:
        """How many jobs wait for the clock (countdowns, etas, retries' backoff)."""
        return len(self.core.life.delayed)

    def waiting(self) -> int:
        """How many jobs wait in their queues or to run, not for the clock."""
        return sum(len(q.pending) for q in self.core.queues.values()) + len(self.deliveries)

    def next_due(self) -> float | None:
        """Seconds until the next job that waits for the clock is due; None if none."""
        due = self.core.life.delayed.next_due()
        return None if due == float("inf") else max(due - self.now, 0.0)

    def why_waiting(self, job_id: bytes) -> str:
        """Why job ``job_id`` has no result once what is ready has run."""
        job = self.core.life.jobs.get(job_id)
        name = job_id.decode(errors="replace")
        if job is None:
            return (
                f"no result for job {name}: the in-memory broker has no such job "
                "(it was sent before the broker was installed)"
            )
        if any(delayed is job for delayed in self.core.life.delayed.jobs()):
            return (
                f"no result for job {name} yet: it waits for the test clock (the next "
                f"delayed job is due in {self.next_due():g} s); call advance() on the "
                "in-memory broker to move it"
            )
        return (
            f"no result for job {name} yet: it waits for the one worker of queue "
            f"{job.queue!r}, which runs a task that waits for it (a job sent on its own "
            "queue and waited for)"
        )

    @property
    def counters(self) -> dict[str, int]:
        """The core's counters (``received``, ``retried``, ``dead_lettered``, ...)."""
        return self.core.counters

    # ---- the core's side ----------------------------------------------------------

    def request(
        self, client: ClientRef, msgid: bytes, queue: str, headers: Headers, body: bytes
    ) -> None:
        """A job from our client: to the core, with a worker for its queue (for a
        workflow: for its steps' queues)."""
        if queue == WORKFLOW_QUEUE:
            self._add_step_workers(body)
        elif queue not in self.workers:
            self._add_worker(queue)
        if headers.run_after:  # a wall time: the same distance ahead on our clock
            ahead = headers.run_after - time.time()
            run_after = max(self.now + self.core.wall_offset + ahead, 1e-9)
            headers = dataclasses.replace(headers, run_after=run_after)
        self.core.client_request(client, msgid, queue, headers, body, self.now)
        self.apply()

    def _add_step_workers(self, body: bytes) -> None:
        try:
            queues = step_queues(parse_workflow(body))
        except ProtocolError:
            return  # the core refuses it, with the reason
        for name in sorted(queues - set(self.workers)):
            self._add_worker(name)

    def refuse(self, client: ClientRef, msgid: bytes, code: str, reason: str) -> None:
        self.core.refuse(client, msgid, code, reason)
        self.apply()

    def cancel(self, job_id: bytes) -> str:
        """The core's answer to a cancel (``cancelled``, ``running``, ``unknown``)."""
        state = self.core.cancel(job_id, self.now)
        self.apply()
        return state

    def _add_worker(self, queue: str) -> None:
        peer = Peer(b"memory-worker:" + queue.encode(), "worker", ((10, queue),), self.now)
        peer.port = self.port  # type: ignore[assignment]
        self.workers[queue] = peer
        self.core.worker_join(peer, self.now)
        self.core.worker_ready(peer, self.now)  # one slot
        self.apply()

    def apply(self) -> None:
        """Carry out the core's effects: deliveries wait to run, answers and
        refusals go to the client; the rest (heartbeats, ...) has nobody to go to."""
        out = self.core.out
        if not out:
            return
        self.core.out = []
        for effect in out:
            kind = type(effect)
            if kind is Deliver:
                self.deliveries.append((effect.peer, effect.job))  # type: ignore[union-attr]
            elif kind is Answer:
                self.client.answer(effect)  # type: ignore[arg-type]
            elif kind is Refuse:
                self.client.refused(effect)  # type: ignore[arg-type]

    def _run(self, peer: Peer, job: Job) -> None:
        """One attempt of ``job``, by the worker code, and its outcome to the core."""
        attempt_id = job.attempt_id
        self.attempts += 1
        if job.cancelled:  # cancelled after its dispatch, before it started
            outcome, body = Outcome(failed=True, ready=True, error=CANCELLED), CANCELLED_UNSTARTED
        else:
            done = run_in_place(job.body, attempt_id, _Sink(self, peer, attempt_id))
            outcome = Outcome(
                failed=done.failed, ready=True, error=done.error_type, retry=done.retry
            )
            body = done.body
        self.core.worker_result(peer, attempt_id, outcome, body, self.now)
        self.apply()
