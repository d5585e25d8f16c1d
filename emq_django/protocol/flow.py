"""Flow control's values, as every peer checks them (docs/features/flow-control.md):
a rate limit (``"100/s"``, ``"10/m"``, ``"3600/h"``), a ``max_concurrency`` and a
concurrency key. The client raises ``TypeError``/``ValueError`` at the call site,
the broker refuses a bad header (``protocol/headers.py``), and the broker's
``EMQ_RATE_LIMITS`` is checked at start-up (``conf.py``).
Pure: no sockets, no clock.
"""

from __future__ import annotations

import json
import math
from typing import Any

# the units of a rate: seconds per unit
RATE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
MAX_RATE = 1_000_000.0  # jobs per second: more is no limit at all
MAX_CONCURRENCY = 2**31 - 1
MAX_CONCURRENCY_KEY = 200  # characters, as a unique key


def parse_rate(value: Any, what: str = "rate_limit") -> float:
    """A rate limit, ``"<number>/<s|m|h>"``, as jobs per second (> 0); raises
    ``TypeError`` for a value that is not a str, ``ValueError`` for a bad one."""
    if not isinstance(value, str):
        raise TypeError(f'{what} must be a str such as "100/s", "10/m" or "5/h", got {value!r}')
    number, sep, unit = value.strip().partition("/")
    seconds = RATE_UNITS.get(unit.strip())
    try:
        count = float(number)
    except ValueError:
        count = math.nan
    if not sep or seconds is None or not math.isfinite(count):
        raise ValueError(
            f'{what} must be "<number>/<unit>" with the unit s, m or h (e.g. "100/s"), '
            f"got {value[:40]!r}"
        )
    if count <= 0:
        raise ValueError(f"{what} must be more than 0 jobs per {unit}, got {value[:40]!r}")
    rate = count / seconds
    if rate > MAX_RATE:
        raise ValueError(f"{what} {value[:40]!r} is over {MAX_RATE:g} jobs per second")
    return rate


def check_max_concurrency(value: Any) -> int:
    """``max_concurrency``: an int from 1 (None, at the call site: no limit); raises
    ``TypeError``/``ValueError``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"max_concurrency must be an int, got {value!r}")
    if not 1 <= value <= MAX_CONCURRENCY:
        raise ValueError(f"max_concurrency must be from 1 to {MAX_CONCURRENCY}, got {value}")
    return value


def check_concurrency_key(value: Any) -> str:
    """A concurrency key: a non-empty str of at most ``MAX_CONCURRENCY_KEY``
    characters, no comma (the headers frame's separator); raises ``TypeError``/
    ``ValueError``."""
    if not isinstance(value, str):
        raise TypeError(f"concurrency_key must be a str, got {value!r}")
    if not value:
        raise ValueError("concurrency_key must not be empty")
    if len(value) > MAX_CONCURRENCY_KEY:
        raise ValueError(
            f"concurrency_key is {len(value)} characters; the most is {MAX_CONCURRENCY_KEY}"
        )
    if "," in value:
        raise ValueError(f"concurrency_key cannot contain a comma: {value[:40]!r}")
    return value


def parse_queue_rates(value: Any) -> dict[str, float]:
    """``EMQ_RATE_LIMITS``: ``{"queue": "10/s"}`` (a dict, or its JSON) -> jobs per
    second by queue name; raises ``TypeError``/``ValueError``."""
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else {}
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f'must be a dict such as {{"email": "10/s"}}, got {value!r}')
    rates = {}
    for queue, rate in value.items():
        if not isinstance(queue, str) or not queue:
            raise TypeError(f"queue names must be non-empty strs, got {queue!r}")
        rates[queue] = parse_rate(rate, f"the rate of queue {queue!r}")
    return rates
