"""tests/support/postgres.py's PgCluster, which the HA tests stop, kill and restart
under running brokers: each of those leaves it as they say, with the data kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.postgres import PgCluster, pg_available


@pytest.mark.skipif(pg_available() is not None, reason=str(pg_available()))
def test_a_cluster_of_our_own_stops_is_killed_and_comes_back_with_its_data(
    tmp_path: Path,
) -> None:
    with PgCluster(tmp_path / "pg") as cluster:
        assert cluster.alive()
        url = cluster.create_database("kept")
        cluster.execute("CREATE TABLE t (n integer)", db="kept")
        cluster.execute("INSERT INTO t VALUES (1)", db="kept")
        cluster.stop("fast")
        assert not cluster.alive() and cluster.postmaster_pid() is None
        cluster.start()
        pid = cluster.postmaster_pid()
        cluster.kill()  # a crash: the postmaster and every backend, at once
        assert not cluster.alive() and cluster.postmaster_pid() is None
        assert pid is not None
        cluster.restart()  # recovery from the crash
        assert cluster.execute("SELECT n FROM t", db="kept") == [(1,)]
        assert url.endswith(f":{cluster.port}/kept")
    assert not cluster.alive()
