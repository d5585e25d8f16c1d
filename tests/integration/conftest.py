"""Fixtures of the integration tests that several modules share."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """A local[2] SparkSession for the module (the analytics tests; another
    module's session, when one is active, is used and left to it)."""
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    from emq_django.analytics import io

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    active = SparkSession.getActiveSession()
    session = active or io.build_session(
        "local[2]",
        {
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.driver.host": "127.0.0.1",
        },
        app_name="emq-tests-analytics",
    )
    yield session
    if active is None:  # another module's session is left to it
        session.stop()
