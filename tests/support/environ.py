"""A test's own settings for the commands it starts and for its own process."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager


@contextmanager
def environment(env: MutableMapping[str, str], extra: Mapping[str, str]) -> Iterator[None]:
    """``extra`` added to ``env`` (what the test's subprocesses get) and to this
    process's ``os.environ`` (what its own client reads) while the block runs;
    ``os.environ`` is put back as it was after it."""
    env.update(extra)
    old = {key: os.environ.get(key) for key in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
