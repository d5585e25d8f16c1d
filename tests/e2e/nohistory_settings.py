"""The example project without the job history: a client whose ``get()`` has only
the broker's REPLY (tests/e2e/test_attempts.py)."""

from project.settings import *  # noqa: F403
from project.settings import INSTALLED_APPS

INSTALLED_APPS = [
    a for a in INSTALLED_APPS if a not in ("emq_django.results", "emq_django.backends")
]
EMQ_RECORDER = ""
