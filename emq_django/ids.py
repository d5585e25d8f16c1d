"""Message and job ids: the one generator every process uses.

An id is 128 bits from the operating system's CSPRNG (``os.urandom``), written
as 32 lower-case hex digits: unguessable, so that knowing one job's id tells
nothing about another's (a job id is what reads its result and history), and
unique without coordination (two equal ids among 2**40 have odds below 2**-48).

``os.urandom`` is a system call; one per id cost more than the old prefix and
counter did. So the generator draws a block of ``BLOCK_IDS`` ids in one call,
hex-encodes and slices it once, and hands out the slices: cheaper per id than
the counter was (``bench/id_cost.py`` measures both). A forked child drops the
block it inherited, so that parent and child never hand out the same ids.

Ids are ASCII, 32 bytes: within every protocol's id limit (eMQP and Majordomo
255 bytes, PZQ 255) and the history tables' 100 characters.
"""

from __future__ import annotations

import os
import weakref

ID_BYTES = 16  # 128 bits
ID_CHARS = 2 * ID_BYTES
BLOCK_IDS = 256  # ids drawn per os.urandom call

_generators: weakref.WeakSet[IdGenerator] = weakref.WeakSet()


def random_id() -> bytes:
    """One id on its own (one system call); ``IdGenerator`` is cheaper for many."""
    return os.urandom(ID_BYTES).hex().encode()


class IdGenerator:
    """``gen()`` returns the next id as bytes, ``gen.text()`` as str.

    ``prefix`` makes the ids ``prefix`` + a hex counter instead: predictable on
    purpose, for tests and replays that compare ids; never for real traffic.
    """

    __slots__ = ("_prefix", "_n", "_ready", "__weakref__")

    def __init__(self, prefix: bytes | None = None) -> None:
        self._prefix = prefix
        self._n = 0
        self._ready: list[bytes] = []  # the current block's ids not handed out yet
        _generators.add(self)

    @property
    def prefix(self) -> bytes | None:
        return self._prefix

    def __call__(self) -> bytes:
        try:
            return self._ready.pop()
        except IndexError:
            pass
        if self._prefix is not None:
            self._n += 1
            return b"%s%08x" % (self._prefix, self._n)
        # cut into ids by bytes.hex's separator and split, in C (a slice each in
        # Python cost 0.2 us an id): handing one out is then a list pop
        ready = os.urandom(ID_BYTES * BLOCK_IDS).hex(" ", -ID_BYTES).encode().split()
        self._ready = ready
        return ready.pop()

    def text(self) -> str:
        return self().decode()

    def _after_fork(self) -> None:
        self._ready = []


def _forget_after_fork() -> None:
    for gen in list(_generators):
        gen._after_fork()


os.register_at_fork(after_in_child=_forget_after_fork)


def split_attempt(attempt_id: bytes) -> tuple[str, int]:
    """``b"<job id>#2"`` -> ("<job id>", 2); an id without ``#`` is attempt 1."""
    job_id, sep, number = attempt_id.rpartition(b"#")
    if not sep or not number.isdigit():
        return attempt_id.decode("utf-8", "replace"), 1
    return job_id.decode("utf-8", "replace"), int(number)
