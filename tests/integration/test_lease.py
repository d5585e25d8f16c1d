"""The broker's lease on a PostgreSQL journal (broker/lease.py), on a real cluster of
the tests' own (tests/support/postgres.py): only one holder, expiry by PostgreSQL's
clock, a new epoch at each taking, renewal lost to a newer epoch, release."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from emq_django.broker.lease import Lease
from emq_django.exceptions import JournalError
from tests.support import wait_until
from tests.support.postgres import PgCluster

TTL = 0.5


@pytest.fixture
def leases(pg_url: str) -> Iterator[tuple[Lease, Lease]]:
    a = Lease(pg_url, "broker-a", TTL, {"frontend": "tcp://10.0.0.1:1"})
    b = Lease(pg_url, "broker-b", TTL, {"frontend": "tcp://10.0.0.2:1"})
    yield a, b
    a.close()
    b.close()


def test_only_one_broker_holds_the_lease(leases: tuple[Lease, Lease]) -> None:
    a, b = leases
    assert a.try_acquire() == 1
    assert b.try_acquire() is None
    assert a.renew() is True
    assert b.try_acquire() is None
    assert (a.epoch, b.epoch) == (1, None)
    assert a.state()["active"] == "broker-a"


def test_an_expired_lease_goes_to_the_next_broker_with_a_new_epoch(
    leases: tuple[Lease, Lease],
) -> None:
    a, b = leases
    assert a.try_acquire() == 1
    # expiry is PostgreSQL's clock: b gets it only once a's TTL has passed there
    epoch = wait_until(b.try_acquire, "b takes the expired lease", timeout=5, interval=0.02)
    assert epoch == 2 and b.epoch == 2
    assert a.renew() is False  # another epoch holds it now
    assert a.epoch is None
    assert a.try_acquire() is None  # b's lease is fresh
    state = b.state()
    assert (state["active"], state["epoch"]) == ("broker-b", 2)
    failover = state["last_failover"]
    assert (failover["from"], failover["to"], failover["took_s"]) == ("broker-a", "broker-b", None)
    b.mark_serving(0.25)
    assert b.state()["last_failover"]["took_s"] == 0.25


def test_renewal_keeps_the_lease_past_its_ttl(leases: tuple[Lease, Lease]) -> None:
    a, b = leases
    a.try_acquire()
    for _ in range(6):  # 3 TTLs' worth of renewals
        assert a.renew()
        assert b.try_acquire() is None
        wait_until(lambda: a.state()["expires_in"] < TTL / 2, "half the TTL gone", timeout=5)
    assert a.epoch == 1


def test_release_lets_the_other_broker_take_over_at_once(leases: tuple[Lease, Lease]) -> None:
    a, b = leases
    a.try_acquire()
    a.release()
    assert a.epoch is None
    assert b.try_acquire() == 2  # no wait for the TTL
    assert a.renew() is False


def test_state_shows_the_active_broker_and_the_standbys(leases: tuple[Lease, Lease]) -> None:
    a, b = leases
    assert a.state()["active"] is None and a.state()["last_failover"] is None
    a.try_acquire()
    a.announce("active")
    b.announce("standby")
    a.mark_serving()  # the first active: no failover to time
    state = b.state()
    assert state["active"] == "broker-a" and state["epoch"] == 1
    assert 0 < state["expires_in"] <= TTL
    assert state["last_failover"] is None
    brokers = {x["name"]: x for x in state["brokers"]}
    assert brokers["broker-a"]["role"] == "active"
    assert brokers["broker-b"]["role"] == "standby"
    assert brokers["broker-b"]["info"] == {"frontend": "tcp://10.0.0.2:1"}
    assert brokers["broker-b"]["seen_ago"] < 5


def test_a_wrong_url_is_a_clear_error_at_once(pg_cluster: PgCluster) -> None:
    with pytest.raises(JournalError, match=r'database "no_such_db" does not exist'):
        Lease(pg_cluster.url("no_such_db"), "x", TTL)
    with pytest.raises(JournalError, match="not a PostgreSQL URL"):
        Lease("postgresql://a b c=", "x", TTL)


def test_postgresql_down_is_an_error_at_once_and_the_lease_comes_back(
    pg_cluster: PgCluster, leases: tuple[Lease, Lease]
) -> None:
    import time

    a, _ = leases
    a.try_acquire()
    pg_cluster.stop("immediate")
    started = time.monotonic()
    for _ in range(3):
        with pytest.raises(JournalError, match="unreachable"):
            a.renew()
    assert time.monotonic() - started < 1.0
    pg_cluster.start()

    def renewed() -> bool:
        try:
            return a.renew()
        except JournalError:
            return False

    wait_until(renewed, "the lease renewed once PostgreSQL is back", timeout=10)
    assert a.epoch == 1
