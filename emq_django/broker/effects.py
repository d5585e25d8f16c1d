"""What the broker core hears and says, in no protocol's terms.

Ports (``broker/ports/``) turn their wire's messages into calls on
``BrokerCore`` that carry these types, and turn the effects the core queues in
``core.out`` back into their wire's frames. A reply leaves by the port its job
came in by: a ``ClientRef`` and a ``Peer`` each know their port (as a
``seam.PortRef``: the core's modules import nothing of ``ports/``).

Effects are small mutable slot classes rather than frozen ones: one or two are
made per job, and a frozen dataclass costs several times as much to build.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from emq_django.broker.seam import ClientRef

if TYPE_CHECKING:
    from emq_django.broker.state import Job, Peer
    from emq_django.broker.topics import Event


@dataclass(frozen=True, slots=True)
class Outcome:
    """How an attempt ended, as the worker said (or the broker decided)."""

    failed: bool
    ready: bool = False  # the worker gives one credit back with it
    error: str = ""  # the exception's type name
    retry: float | None = None  # emq.Retry: the delay asked for, -1 for the backoff
    lost: str | None = None  # the attempt ended with its worker process: how
    requeue: bool = False  # given back unstarted (the worker process is going away)
    raw: bytes = b""  # the eMQP status frame as the worker sent it, if it was one


OK_READY = Outcome(failed=False, ready=True)


# ---- effects ----------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class Deliver:
    """Run the job's current attempt (``job.attempt_id``) on ``peer``."""

    peer: Peer
    job: Job
    # a ranked queue's job to a worker process of ours: its rank (the ``rank``
    # header, broker/priority.py ``wire_rank``); None otherwise
    rank: int | None = None


@dataclass(slots=True, eq=False)
class Answer:
    """A result for the client that sent ``job``: final, or a partial one."""

    client: ClientRef
    job: Job
    body: bytes
    outcome: Outcome
    more: tuple[bytes, ...] = ()  # further body frames (Majordomo replies)
    final: bool = True
    seq: int = 0  # a partial's number within its attempt (1, 2, ...)


@dataclass(slots=True, eq=False)
class Acknowledge:
    client: ClientRef
    msgid: bytes
    # may wait a little (server.ACK_DELAY) to go with the job's reply, to a client
    # that reads several per ACK (``acks``): a job that asked for a reply and is not
    # guaranteed (its sender does not wait for the ACK)
    lazy: bool = False


@dataclass(slots=True, eq=False)
class Refuse:
    client: ClientRef
    msgid: bytes
    code: str
    reason: str


@dataclass(slots=True, eq=False)
class Beat:
    """A heartbeat to ``peer``; ``wall`` is the broker's wall clock."""

    peer: Peer
    wall: float


@dataclass(slots=True, eq=False)
class Goodbye:
    """The broker is done with ``peer`` (eMQP KBYE, Majordomo DISCONNECT)."""

    peer: Peer


@dataclass(slots=True, eq=False)
class Kill:
    """Ask a job manager to kill the worker process running ``attempt_id``."""

    peer: Peer
    attempt_id: bytes


@dataclass(slots=True, eq=False)
class Stop:
    """Ask our job manager (its control connection ``peer``) to finish its running
    jobs and exit (the admin's stop, ``broker/manager_control.py``)."""

    peer: Peer


@dataclass(slots=True, eq=False)
class Resize:
    """Ask our job manager (its control connection ``peer``) to run ``concurrency``
    worker processes (the admin's pool resize, ``broker/manager_control.py``)."""

    peer: Peer
    concurrency: int


@dataclass(slots=True, eq=False)
class Forward:
    """Pass ``payload`` (a schedule command, opaque to the core) to ``peer``."""

    peer: Peer
    payload: Any


@dataclass(slots=True, eq=False)
class Forget:
    """The core has dropped ``peer``: its port forgets the identity."""

    peer: Peer


@dataclass(slots=True, eq=False)
class Published:
    """An event was numbered and kept: the server offers it to every port
    (``Port.on_published``), each of which fans it out to its own subscribers."""

    event: Event


@dataclass(slots=True, eq=False)
class Send:
    """Frames a port sends to one of its clients outside the core's job effects
    (an Event BUS snapshot: one SYNC per kept event). ``frames`` go out as they
    are on the socket ``encode_routed`` names."""

    client: ClientRef
    frames: list[bytes]


Effect: TypeAlias = (
    Deliver
    | Answer
    | Acknowledge
    | Refuse
    | Beat
    | Goodbye
    | Kill
    | Stop
    | Resize
    | Forward
    | Forget
    | Published
    | Send
)
