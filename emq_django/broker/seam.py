"""What the core's modules name of a port, without importing the ports' layer.

A reply leaves by the port its job came in by, so a ``ClientRef`` (in the core's
effects) and a ``Peer`` (in its state) each hold their port. The core reads two
of that port's declarations (``acknowledges``, ``always_streams``) and the
server hands it the effects (``post``); nothing else. Naming the ``Port`` class
(``broker/ports/base.py``) for that made the core's modules import the ports'
layer, which imports the core: an import cycle through effects, state and the
port base. These small types sit below all of them instead; ``Port`` satisfies
``PortRef`` without naming it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

# one message from a socket: (identity, frames, now) -> frames to send straight back
Handler = Callable[[bytes, Sequence[bytes], float], "list[bytes] | None"]


class PortRef(Protocol):
    """What the core and the server's send path need of the port a client or a
    peer came in by (``broker/ports/base.py``'s ``Port`` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def acknowledges(self) -> bool:
        """Its wire has an ACK for an accepted request."""
        ...

    @property
    def always_streams(self) -> bool:
        """Its clients get partial results whatever their request said."""
        ...

    def post(self, to: Any, effect: Any) -> None:
        """One of the core's effects for ``to`` (a ``ClientRef`` or ``Peer`` of this
        port), to send now or with others at the next flush."""
        ...


@dataclass(slots=True, eq=False)
class ClientRef:
    """Where a client's answers go: its port, its identity there, and what the
    port needs beyond that to address the answer (``tag``: e.g. the Majordomo
    request id; ``extra``: e.g. the Majordomo framing and service)."""

    port: PortRef
    identity: bytes
    tag: bytes = b""
    extra: Any = None
    # an eMQP client that reads an ACK naming several msgids (its REQUESTs carry the
    # ``acks`` header flag): the server sends it one ACK per turn, not one per job
    acks: bool = False
    # it sent REQUESTS (several jobs a message: our client only), so it reads that
    # ACK's msgids in one frame, separated by LF (protocol/batch.py)
    packed: bool = False
