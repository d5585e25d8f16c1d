"""Where benchmark results go: ``bench/results/<benchmark>-<YYYY-MM-DD>-<label>.json``.

One naming scheme for every script (``bench/summary.py`` reads it back): the
benchmark's name (``fair`` for ``bench/run.py``, ``topics``, ``mdp``, ``pzq``,
``memory``, ``analytics``, ...), the UTC date of the run, and a label (the session,
branch or condition: ``s27-quiet``; by default the UTC time, ``1947``).
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
NAME = re.compile(
    r"^(?P<benchmark>[a-z][a-z0-9-]*?)-(?P<date>\d{4}-\d\d-\d\d)-(?P<label>[\w.-]+)\.json$"
)


def result_path(benchmark: str, label: str = "", when: dt.datetime | None = None) -> Path:
    """The file a run of ``benchmark`` writes to, named by the scheme above."""
    when = when or dt.datetime.now(dt.UTC)
    label = label or when.strftime("%H%M")
    path = RESULTS / f"{benchmark}-{when:%Y-%m-%d}-{label}.json"
    if not NAME.match(path.name):
        raise ValueError(f"{path.name!r} does not follow <benchmark>-<YYYY-MM-DD>-<label>.json")
    return path
