"""The example project with Sentry, as an application sets it up: ``sentry_sdk.init``
(its default integrations; the DSN from ``EMQ_TEST_SENTRY_DSN``, a local endpoint
of tests/e2e/test_sentry.py) and emq's failed jobs connected to it."""

import os

import sentry_sdk

from emq_django import sentry
from project.settings import *  # noqa: F403

sentry_sdk.init(dsn=os.environ["EMQ_TEST_SENTRY_DSN"], traces_sample_rate=0)
sentry.connect()
