"""What only the PostgreSQL journal does (broker/journal_pg.py): fencing by the
lease's epoch, a fast and clear failure while PostgreSQL is down and recovery once
it is back, clear errors at start; on a cluster of the tests' own."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from emq_django.broker.journal_pg import PgJournal
from emq_django.broker.lease import Lease
from emq_django.exceptions import JournalError, LeaseLost
from tests.integration import test_broker_server as base
from tests.support import wait_until
from tests.support.postgres import PgCluster

start_broker = base.start_broker  # the fixture: a BrokerServer in a thread

WALL = 1_000_000.0
TTL = 0.5


def put(job_id: bytes, state: str = "ready") -> tuple[Any, ...]:
    return ("put", job_id, "default", b"guarantee", b"body", state, 0, 0.0, WALL, WALL)


@pytest.fixture
def journal(pg_url: str) -> Iterator[PgJournal]:
    j = PgJournal(pg_url, name="broker-a")
    yield j
    j.close()


def rows(url: str) -> list[tuple[bytes, str]]:
    """What another connection sees: the committed jobs."""
    other = PgJournal(url, name="reader")
    try:
        return [(r.id, r.state) for r in other.load()]
    finally:
        other.close()


def ids(url: str) -> list[bytes]:
    return [job_id for job_id, _ in rows(url)]


def test_a_broker_that_lost_the_lease_cannot_commit(journal: PgJournal, pg_url: str) -> None:
    a = Lease(pg_url, "broker-a", TTL)
    b = Lease(pg_url, "broker-b", TTL)
    try:
        epoch = a.try_acquire()
        journal.fence(epoch, TTL)
        journal.apply([put(b"mine")])
        wait_until(b.try_acquire, "b takes the expired lease", timeout=5, interval=0.02)
        with pytest.raises(LeaseLost, match="another broker took over"):
            journal.apply([put(b"too-late"), ("done", b"mine", WALL)])
        assert rows(pg_url) == [(b"mine", "ready")]  # nothing of the fenced turn
        assert journal.errors == 1
    finally:
        a.close()
        b.close()


def test_each_commit_renews_the_lease(journal: PgJournal, pg_url: str) -> None:
    a = Lease(pg_url, "broker-a", TTL)
    b = Lease(pg_url, "broker-b", TTL)
    try:
        journal.fence(a.try_acquire(), TTL)
        deadline = time.monotonic() + 3 * TTL
        n = 0
        while time.monotonic() < deadline:  # commits only, no renew() for 3 TTLs
            journal.apply([put(b"%d" % n)])
            n += 1
            assert b.try_acquire() is None
            time.sleep(TTL / 5)
        assert a.renew() is True and a.epoch == 1
    finally:
        a.close()
        b.close()


def test_postgresql_down_fails_at_once_and_the_journal_recovers(
    pg_cluster: PgCluster, journal: PgJournal, pg_url: str
) -> None:
    journal.apply([put(b"before")])
    pg_cluster.stop("immediate")
    started = time.monotonic()
    for i in range(5):  # the first finds the connection broken, the others fail at once
        with pytest.raises(JournalError, match="unreachable"):
            journal.apply([put(b"during-%d" % i)])
    assert time.monotonic() - started < 1.0
    assert journal.stats()["error"]
    pg_cluster.start()

    def written() -> bool:
        try:
            journal.apply([put(b"after")])
        except JournalError:
            return False
        return True

    wait_until(written, "a commit once PostgreSQL is back", timeout=10)
    assert ids(pg_url) == [b"before", b"after"]
    assert journal.stats()["reconnects"] == 1


def test_wrong_url_no_database_or_no_permission_is_a_clear_error(pg_cluster: PgCluster) -> None:
    with pytest.raises(JournalError, match=r'database "nowhere" does not exist'):
        PgJournal(pg_cluster.url("nowhere"))
    port = pg_cluster.port
    free = port + 1 if port < 31999 else port - 1
    with pytest.raises(JournalError, match="Connection refused|connection to server"):
        PgJournal(f"postgresql://postgres@127.0.0.1:{free}/emq")
    pg_cluster.execute("DROP ROLE IF EXISTS emq_nobody")
    pg_cluster.execute("CREATE ROLE emq_nobody LOGIN")
    url = pg_cluster.create_database("emq_no_permission")
    try:
        with pytest.raises(JournalError, match="permission denied"):
            PgJournal(url.replace("postgres@", "emq_nobody@"))
    finally:
        pg_cluster.drop_database("emq_no_permission")


def test_a_new_journal_moves_the_old_tables_aside(journal: PgJournal, pg_url: str) -> None:
    journal.apply([put(b"old")])
    fresh = PgJournal(pg_url, new=True)
    try:
        assert fresh.load() == []
        fresh.apply([put(b"new")])
    finally:
        fresh.close()
    assert ids(pg_url) == [b"new"]


def stored(url: str) -> dict[bytes, tuple[str, bytes, int, float]]:
    """Each committed job's state, body, attempts and last update."""
    other = PgJournal(url, name="reader")
    try:
        return {r.id: (r.state, bytes(r.body), r.attempts, r.updated_at) for r in other.load()}
    finally:
        other.close()


def test_a_turn_of_puts_and_dones_is_written_as_the_statement_path_writes_it(
    journal: PgJournal, pg_url: str
) -> None:
    """The one-statement path (puts and dones only, ``fold_jobs``) against the
    statement-by-statement one (a turn with another operation): the same rows.
    A job put and ended within the turn is a done one without its body; a done of
    an earlier turn's job, a put again of a known job (a new state and attempts,
    its body kept) are as before; a done of a job the journal never had is kept as
    the id of an ended job (emq_done), as the broker's memory keeps it."""
    a = Lease(pg_url, "broker-a", TTL)
    try:
        journal.fence(a.try_acquire(), TTL)
        for tag, extra in ((b"f", []), (b"s", [("delete", b"never-there")])):
            journal.apply([put(tag + b"-old"), put(tag + b"-again")])
            again = (
                "put",
                tag + b"-again",
                "default",
                b"g",
                b"new",
                "ready",
                3,
                5.0,
                WALL,
                WALL + 3,
            )
            journal.apply(
                [
                    put(tag + b"-new"),
                    put(tag + b"-short"),
                    ("done", tag + b"-old", WALL + 1),
                    ("done", tag + b"-short", WALL + 2),
                    again,
                    ("done", tag + b"-unknown", WALL + 4),
                    *extra,
                ]
            )
        got = stored(pg_url)
        for tag in (b"f", b"s"):
            assert got[tag + b"-new"] == ("ready", b"body", 0, WALL)
            assert got[tag + b"-short"] == ("done", b"", 0, WALL + 2)
            assert got[tag + b"-old"] == ("done", b"", 0, WALL + 1)
            assert got[tag + b"-again"] == ("ready", b"body", 3, WALL + 3)
            assert got[tag + b"-unknown"] == ("done", b"", 0, WALL + 4)
        assert journal.commits == 4
    finally:
        a.close()


def test_a_job_named_twice_in_a_turn_is_written_in_order(journal: PgJournal, pg_url: str) -> None:
    """A turn that puts a job, ends it and puts it again (or ends it twice) cannot be
    one statement (it would touch a row twice): it is written statement by statement,
    in order."""
    journal.apply([put(b"x"), ("done", b"x", WALL + 1), put(b"x", "delayed"), put(b"y")])
    journal.apply([("done", b"y", WALL + 2), ("done", b"y", WALL + 3)])
    got = stored(pg_url)
    assert got[b"x"][0] == "delayed"
    assert got[b"y"] == ("done", b"", 0, WALL + 3)


def test_the_broker_reads_on_while_a_commit_waits_and_acks_after_it(
    start_broker: Any, pg_url: str
) -> None:
    """A BrokerServer on the PostgreSQL journal commits on its writer thread: while a
    commit waits (on a real table lock held by another connection) the loop still
    answers its monitor, and the guaranteed job's ACK comes only after the commit."""
    import psycopg
    import zmq

    from emq_django.protocol import Ack
    from tests.integration.test_broker_server import recv_command, send_request

    broker = start_broker(JOURNAL_URL=pg_url, JOURNAL_PATH="")
    client = broker.client()
    send_request(client, b"g-0", headers=b"guarantee")
    assert recv_command(client, Ack).ack_msgid == b"g-0"
    with psycopg.connect(pg_url) as other:
        other.execute("LOCK TABLE emq_jobs IN EXCLUSIVE MODE")  # the next commit waits
        send_request(client, b"g-1", headers=b"guarantee")
        req = broker.socket(zmq.REQ, broker.monitor)
        req.send(b"DEADLETTERS LIST")
        answered = bool(req.poll(500))  # within the journal's lock_timeout (1 s)
        acked_early = bool(client.poll(0))
        other.rollback()
    assert answered, "the loop was held by the commit"
    assert not acked_early, "ACKed before its commit"
    assert recv_command(client, Ack).ack_msgid == b"g-1"
    assert b"g-1" in ids(pg_url)


def test_saved_jobs_go_ahead_turn_after_turn_while_a_commit_waits(
    start_broker: Any, pg_url: str
) -> None:
    """While one commit waits (a real table lock), every later turn of the loop
    still delivers the jobs earlier commits saved, each as its worker gives credit
    back (the server reads only what each turn added to what waits: ``_send_ahead``);
    a job that came after the commit started is neither ACKed nor delivered before
    its own commit."""
    import psycopg

    from emq_django.protocol import Ack, Request
    from tests.integration.test_broker_journal import answer, no_request_within
    from tests.integration.test_broker_server import recv_command, send_request

    broker = start_broker(JOURNAL_URL=pg_url, JOURNAL_PATH="")
    worker = broker.worker()
    worker.send_multipart([b"", base.P, b"READY", b"r"])  # one credit
    client = broker.client()
    for n in (1, 2, 3):
        send_request(client, b"g-%d" % n, headers=b"guarantee")
        assert recv_command(client, Ack).ack_msgid == b"g-%d" % n
    job = recv_command(worker, Request)
    with psycopg.connect(pg_url) as other:
        other.execute("LOCK TABLE emq_jobs IN EXCLUSIVE MODE")  # the next commit waits
        answer(worker, job)  # g-1 done: its commit waits for the lock
        got = [job.msgid]
        send_request(client, b"g-4", headers=b"guarantee")  # saved by the commit after
        for _ in range(2):  # (the journal's lock_timeout is 1 s: this takes far less)
            job = recv_command(worker, Request, timeout=0.5)
            got.append(job.msgid)
            answer(worker, job)  # its credit back, in a turn of its own
        early = no_request_within(worker, 0.15)
        acked_early = bool(client.poll(0))
        other.rollback()
    assert got == [b"g-1#1", b"g-2#1", b"g-3#1"]
    assert early == [], "a job delivered before its commit"
    assert not acked_early, "ACKed before its commit"
    assert recv_command(client, Ack).ack_msgid == b"g-4"
    assert recv_command(worker, Request).msgid == b"g-4#1"


def test_a_done_row_keeps_the_reply_of_a_job_whose_client_wants_one(
    journal: PgJournal, pg_url: str
) -> None:
    """``KeepReply`` (broker/kept_replies.py): the done row holds the reply, for a
    broker that takes over before the reply reached the client; a plain done
    keeps none. Fenced, mixed with puts and dones in one turn: written as one
    statement (``fold_jobs``) and statement by statement (a turn with another
    operation), the same rows."""
    a = Lease(pg_url, "broker-a", TTL)
    try:
        journal.fence(a.try_acquire(), TTL)
        for tag, extra in ((b"f", []), (b"s", [("delete", b"never-there")])):
            journal.apply([put(tag + b"-earlier"), put(tag + b"-plain")])
            journal.apply(
                [
                    put(tag + b"-short"),
                    ("reply", tag + b"-earlier", b"kept-1", WALL + 1),
                    ("done", tag + b"-plain", WALL + 2),
                    ("reply", tag + b"-short", b"kept-2", WALL + 3),
                    *extra,
                ]
            )
        got = stored(pg_url)
        for tag in (b"f", b"s"):
            assert got[tag + b"-earlier"] == ("done", b"kept-1", 0, WALL + 1)
            assert got[tag + b"-short"] == ("done", b"kept-2", 0, WALL + 3)
            assert got[tag + b"-plain"] == ("done", b"", 0, WALL + 2)
        assert journal.one_statement == 3  # all turns but the one with a delete
    finally:
        a.close()


def test_a_job_refused_because_the_lease_was_lost_says_so(start_broker: Any, pg_url: str) -> None:
    """A broker whose lease another broker took cannot save a guaranteed job: it is
    refused with its own code, ``lease-lost`` (our clients send it again to the new
    active broker, not raise), not ``journal-error``."""
    from emq_django.protocol import Ack, Error
    from tests.integration.test_broker_server import recv_command, send_request

    broker = start_broker(JOURNAL_URL=pg_url, JOURNAL_PATH="", BROKER_NAME="broker-a")
    a = Lease(pg_url, "broker-a", TTL)
    b = Lease(pg_url, "broker-b", TTL)
    try:
        assert broker.server.journal is not None
        broker.server.journal.fence(a.try_acquire(), TTL)
        client = broker.client()
        send_request(client, b"g-0", headers=b"guarantee")
        assert recv_command(client, Ack).ack_msgid == b"g-0"
        wait_until(b.try_acquire, "b takes the expired lease", timeout=5, interval=0.02)
        send_request(client, b"g-1", headers=b"guarantee")
        err = recv_command(client, Error)
        assert (err.ref_msgid, err.code) == (b"g-1", "lease-lost")
        assert "no longer ours" in err.reason
    finally:
        a.close()
        b.close()


def test_a_commit_that_fails_on_the_writer_refuses_its_jobs_and_delivers_none(
    start_broker: Any, pg_url: str
) -> None:
    """The writer's commit fails (the table lock outlasts the journal's lock_timeout):
    the guaranteed job is refused with the reason, no worker gets it, and the next
    one is saved and ACKed once the lock is gone."""
    import psycopg

    from emq_django.protocol import Ack, Error, Request
    from tests.integration.test_broker_journal import no_request_within
    from tests.integration.test_broker_server import P, recv_command, send_request

    broker = start_broker(JOURNAL_URL=pg_url, JOURNAL_PATH="")
    worker = broker.worker()
    worker.send_multipart([b"", P, b"READY", b"r"])
    client = broker.client()
    with psycopg.connect(pg_url) as other:
        other.execute("LOCK TABLE emq_jobs IN EXCLUSIVE MODE")
        send_request(client, b"g-1", headers=b"guarantee")
        err = recv_command(client, Error, timeout=10)  # after lock_timeout (1 s)
        other.rollback()
    assert (err.ref_msgid, err.code) == (b"g-1", "journal-error")
    assert "not saved" in err.reason and "lock" in err.reason
    assert [c for c in no_request_within(worker, 0.5) if isinstance(c, Request)] == []
    send_request(client, b"g-2", headers=b"guarantee")
    assert recv_command(client, Ack).ack_msgid == b"g-2"
    assert recv_command(worker, Request).msgid == b"g-2#1"
    assert ids(pg_url) == [b"g-2"]


def _table_stats(url: str) -> tuple[int, int, int]:
    """(rows inserted, rows deleted, rows read by sequential scans) of emq_jobs, as
    the statistics have them (a backend reports when it goes idle)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT n_tup_ins, n_tup_del, COALESCE(seq_tup_read, 0) FROM pg_stat_user_tables"
            " WHERE relname = 'emq_jobs'"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def test_a_turn_of_dones_finds_its_rows_by_the_index_once_the_table_has_grown(
    journal: PgJournal, pg_url: str
) -> None:
    """The one-statement turn is a prepared statement: PostgreSQL builds a generic
    plan for it after five runs and keeps it. Built while the table was almost
    empty, that plan joined the dones with the whole table (a sequential scan per
    commit, its cost growing with the table: most of PostgreSQL's CPU per
    guaranteed job in bench/guaranteed_bench.py). Each run is planned for its own
    rows and the table's size now (plan_cache_mode), so a done is found by its id."""
    previous = [b"unknown-%d" % i for i in range(12)]  # (dones of no row: their ids kept)
    for turn in range(8):  # as the broker's: 12 new jobs, 12 done (the statement's first runs)
        new = [b"a%d-%d" % (turn, i) for i in range(12)]
        journal.apply([put(job) for job in new] + [("done", job, WALL) for job in previous])
        previous = new
    journal.link.get().execute("SELECT pg_stat_force_next_flush()")
    journal.apply([put(b"b%05d" % i) for i in range(5000)])  # the table grows
    _, deleted, scanned = wait_until(
        lambda: (s := _table_stats(pg_url))[0] >= 96 + 5000 and s, "the puts' statistics", 60
    )
    journal.link.get().execute("SELECT pg_stat_force_next_flush()")
    turn = [put(b"c%d" % i) for i in range(12)] + [("done", b"b%05d" % i, WALL) for i in range(12)]
    journal.apply(turn)  # the statement as in the first runs (its parameters' types too)
    after = wait_until(
        lambda: (s := _table_stats(pg_url))[1] >= deleted + 12 and s, "the dones' statistics", 60
    )
    assert after[2] == scanned, "the turn of dones read the whole table"
    assert sum(1 for _, state in rows(pg_url) if state == "done") == 8 * 12 + 12


def test_the_turns_statement_is_planned_once_not_at_each_commit(journal: PgJournal) -> None:
    """Planning the turn's one statement (its CTEs, the fence) cost PostgreSQL about as
    much as the rows of a turn of ten guaranteed jobs (bench/README.md, Guaranteed
    jobs): it is planned once, a generic plan kept, and each commit only runs it."""
    lease = Lease(journal.url, "broker-a", 5.0)
    try:
        journal.fence(lease.try_acquire(), 5.0)
        previous: list[bytes] = []
        for turn in range(12):
            new = [b"p%d-%d" % (turn, i) for i in range(5)]
            journal.apply([put(job) for job in new] + [("done", job, WALL) for job in previous])
            previous = new
        assert journal.one_statement == 12
        plans = (
            journal.link.get()
            .execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                " WHERE statement LIKE 'WITH p AS (INSERT INTO emq_jobs%'"
            )
            .fetchall()
        )
        # (one statement per set of the parameters' types: an empty list's differs)
        assert plans and all(custom == 0 for _, custom in plans)
        assert sum(generic for generic, _ in plans) == 12
    finally:
        lease.close()


def test_the_jobs_table_has_only_the_indexes_its_statements_search(journal: PgJournal) -> None:
    """Each guaranteed job writes two row versions, an entry in every index each: the
    table's indexes are the id (puts' conflicts, dones), the spilled jobs by queue
    and the done ones by age (pruning), no index on ``seq`` alone."""
    conn = journal.link.get()
    found = conn.execute(
        "SELECT indexdef FROM pg_indexes WHERE tablename = 'emq_jobs' ORDER BY indexname"
    ).fetchall()
    assert [d.split(" USING ", 1)[1] for (d,) in found] == [
        "btree (updated_at) WHERE (state = 'done'::text)",
        "btree (id)",
        "btree (queue, seq) WHERE (state = 'spilled'::text)",
    ]
    journal.apply([put(b"b"), put(b"a"), ("done", b"b", WALL + 1), put(b"c", "spilled")])
    assert [(j.id, j.state) for j in journal.load()] == [
        (b"b", "done"),
        (b"a", "ready"),
        (b"c", "spilled"),
    ]
    assert [j.id for j in journal.load_spilled("default", 10)] == [b"c"]


def _count(url: str, sql: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
    assert row is not None
    return int(row[0])


def test_a_done_deletes_its_row_and_keeps_its_id_until_the_dedupe_window_ends(
    journal: PgJournal, pg_url: str
) -> None:
    """A guaranteed job's done deletes its row and appends its id to emq_done (one
    statement, fenced or not, and statement by statement alike): a broker that
    loads the journal knows it as done (a resend is a duplicate) until pruned. A
    done that keeps a reply (``KeepReply``, also a unique key's empty one) keeps
    its row."""
    journal.apply([put(b"a"), put(b"b"), put(b"r")])
    journal.apply([("done", b"a", WALL + 1), ("reply", b"r", b"", WALL + 1)])  # one statement
    journal.apply([("done", b"b", WALL + 2), ("delete", b"never-there")])  # one by one
    assert _count(pg_url, "SELECT COUNT(*) FROM emq_jobs WHERE id IN ('\\x61', '\\x62')") == 0
    assert _count(pg_url, "SELECT COUNT(*) FROM emq_done") == 2
    assert sorted((j.id, j.state, j.updated_at) for j in journal.load()) == [
        (b"a", "done", WALL + 1),
        (b"b", "done", WALL + 2),
        (b"r", "done", WALL + 1),
    ]
    assert journal.stats()["jobs"] == {"done": 3}
    journal.apply([("prune_done", WALL + 1.5)])
    assert [j.id for j in journal.load()] == [b"b"]


def _turn_statements(journal: PgJournal) -> list[str]:
    return [
        statement
        for (statement,) in journal.link.get()
        .execute(
            "SELECT statement FROM pg_prepared_statements"
            " WHERE statement LIKE 'WITH p AS (INSERT INTO emq_jobs%'"
        )
        .fetchall()
    ]


def test_new_jobs_are_inserted_plainly_and_a_known_id_as_an_upsert(
    journal: PgJournal, pg_url: str
) -> None:
    """The turn's statement inserts new ids without ON CONFLICT (its speculative
    insertion costs PostgreSQL a look into the index and a WAL record per row); a
    turn that puts an id the table holds already (a put again, a resend after its
    de-duplication window) fails that and is written again, whole, as the upsert:
    nothing of it lost, nothing twice, fenced or not."""
    lease = Lease(journal.url, "broker-a", 5.0)
    try:
        journal.fence(lease.try_acquire(), 5.0)
        journal.apply([put(b"a", "spilled"), put(b"b")])
        assert journal.upserts == 0
        assert [("ON CONFLICT" in s) for s in _turn_statements(journal)] == [False]
        journal.apply([put(b"c"), put(b"a"), ("done", b"b", WALL + 1)])
        assert (journal.upserts, journal.errors, journal.commits) == (1, 0, 2)
        assert sorted("ON CONFLICT" in s for s in _turn_statements(journal)) == [False, True]
        assert sorted(rows(pg_url)) == [(b"a", "ready"), (b"b", "done"), (b"c", "ready")]
        journal.fence(None, 5.0)
        journal.apply([put(b"d"), put(b"c", "delayed")])
        assert (journal.upserts, journal.errors) == (2, 0)
        assert dict(rows(pg_url))[b"c"] == "delayed" and b"d" in ids(pg_url)
    finally:
        lease.close()
