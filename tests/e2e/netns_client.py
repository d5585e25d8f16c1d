"""The client of tests/e2e/test_netns.py, run in the client's network namespace:
``python netns_client.py SECRET [COUNT]`` sends COUNT ``seal`` jobs whose argument
starts with SECRET, waits for every result and prints them as one JSON line."""

from __future__ import annotations

import json
import os
import sys

import django


def main(secret: str, count: int) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    django.setup()
    from tests.e2e.netns_tasks import seal

    results = [seal.delay(f"{secret}-{n}") for n in range(count)]
    print(json.dumps([r.get(timeout=60) for r in results]), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5)
