"""Message and job ids: the one generator every process uses.

An id is a random prefix (12 hex digits from ``os.urandom``, drawn again in a
forked child so that parent and child never share one) and a zero-padded hex
counter. Unique across processes and machines without coordination, cheap (one
``%`` format per id), and it sorts by creation within a process.
"""

from __future__ import annotations

import os
import weakref

PREFIX_BYTES = 6

_generators: weakref.WeakSet[IdGenerator] = weakref.WeakSet()


def random_prefix() -> bytes:
    return os.urandom(PREFIX_BYTES).hex().encode()


class IdGenerator:
    """``gen()`` returns the next id as bytes, ``gen.text()`` as str.

    ``prefix`` fixes the prefix (tests, and a broker that wants a recognisable
    one); otherwise it is random, and drawn again after ``fork()``.
    """

    __slots__ = ("_prefix", "_n", "_fixed", "__weakref__")

    def __init__(self, prefix: bytes | None = None) -> None:
        self._fixed = prefix is not None
        self._prefix = prefix if prefix is not None else random_prefix()
        self._n = 0
        _generators.add(self)

    @property
    def prefix(self) -> bytes:
        return self._prefix

    def __call__(self) -> bytes:
        self._n += 1
        return b"%s%08x" % (self._prefix, self._n)

    def text(self) -> str:
        return self().decode()

    def _after_fork(self) -> None:
        if not self._fixed:
            self._prefix = random_prefix()
            self._n = 0


def _reseed_after_fork() -> None:
    for gen in list(_generators):
        gen._after_fork()


os.register_at_fork(after_in_child=_reseed_after_fork)
