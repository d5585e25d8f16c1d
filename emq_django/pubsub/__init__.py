"""Publish and subscribe on the broker's topic space, through its Event BUS port.

``emq.publish("/orders/created", {"id": 1})`` sends the event to the collector
port, with its data in MessagePack whatever the content type (the released bus
decodes every data frame so): data as its MessagePack value (``application/json``
too), bytes as a MessagePack ``bin``, text (``text/...``) as a MessagePack string;
another content type raises ``ValueError``. Towards emq's broker, publishing is
confirmed (``confirm=True``, the default, ``EMQ_BUS_CONFIRM``): the events go in
emq's confirmed batches, and the broker answers once they are numbered and in the
journal (``publish_confirm.py``). Publishing is pipelined: a call returns at once,
and waits only when ``WINDOW_EVENTS`` events are unconfirmed; ``PublishUnconfirmed``
says how many events the broker refused or did not confirm within
``EMQ_BUS_CONFIRM_TIMEOUT``. ``emq.wait_published()`` waits for every confirmation
of the calling thread; at exit the process waits for them too, and logs an error
with the exact count of those that did not come. ``confirm=False`` sends the
document's plain PUB (never acknowledged), for a foreign Event BUS server such as
the released event-bus-zeromq. ``emq.publish_on_commit(...)`` publishes once the
surrounding database transaction commits (never if it rolls back).

``emq.subscribe("/orders/", since=seq)`` yields the events on topics under the
prefixes, in sequence order, each once, as the ZeroMQ Clone pattern gets them: a
SUB socket for live events and the snapshot port for what it missed. A jump in the
sequence may be a dropped message (a subscriber slower than its PUB pipe) or
events on other topics (the sequence is one for the whole broker); either way the
subscriber asks the snapshot for the events above the last one it has and
buffers live ones meanwhile. When nothing arrives for ``idle_check`` seconds it
asks too, so a lost last event, or a broker restart, is noticed. Use
``async for event in emq.asubscribe(...)`` in asyncio code.

With CURVE on (``EMQ_CURVE_SECRET_KEY``) every socket here carries this process's
keys, as the client's do. A broker that refuses the handshake (a key it does not
know, or none) raises ``HandshakeRefused`` with the reason: ``publish`` waits for
the outcome of its socket's first handshake (a round trip, once per thread; not
when nobody listens), a subscription as soon as libzmq reports it.
"""

from __future__ import annotations

from emq_django.pubsub.clone import LATEST, CloneState, Expired
from emq_django.pubsub.publishing import (
    _Publisher,
    encode_data,
    new_uuid,
    publish,
    publish_many,
    publish_on_commit,
    wait_published,
)
from emq_django.pubsub.received import Received, received
from emq_django.pubsub.subscribing import (
    Subscription,
    _ask_snapshot,
    asubscribe,
    snapshot_identity,
    subscribe,
)

__all__ = [
    "LATEST",
    "CloneState",
    "Expired",
    "Received",
    "Subscription",
    "_Publisher",
    "_ask_snapshot",
    "asubscribe",
    "encode_data",
    "new_uuid",
    "publish",
    "publish_many",
    "publish_on_commit",
    "received",
    "snapshot_identity",
    "subscribe",
    "wait_published",
]
