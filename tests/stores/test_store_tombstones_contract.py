"""The store contract of the purge's tombstones (``IJobStore.was_purged``), on each store.

Reuses the stores of :mod:`.test_store_contract`: memory, the defaults of
``IJobStore`` through ``MinimalStore`` (which keep no tombstone: ``was_purged``
answers False, as a third-party store inherits it), PostgreSQL and MariaDB.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

import pytest
from sqlalchemy import Engine, create_engine, delete, insert, select, text, update
from sqlalchemy import exc as sa_exc

from pypepper_dramatiq.rules.retention import TOMBSTONE_KEEP
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import IJobStore, JobRecord, utcnow
from pypepper_dramatiq.stores.memory import MemoryJobStore
from pypepper_dramatiq.stores.schema import jobs, purged
from pypepper_dramatiq.stores.sql import SqlJobStore
from pypepper_dramatiq.stores.sql.boundary import purged_meanwhile
from pypepper_dramatiq.stores.sql.engine import transaction
from pypepper_dramatiq.stores.sql.mapping import row_values
from pypepper_dramatiq.stores.sql.purge import bury

from .test_store_contract import T0, MinimalStore, job, store

__all__ = ["store"]  # the fixture: every store of the contract

#: Jobs ended at T0; the purge's cutoff is a day later.
CUTOFF = T0 + timedelta(days=1)

#: Sessions of the store's database waiting on a lock (held by another transaction).
LOCK_WAITERS = {
    "postgresql": "SELECT count(*) FROM pg_stat_activity "
    "WHERE wait_event_type = 'Lock' AND datname = current_database()",
    # The insert statement still running: the purge's locks are all it can wait on
    # (innodb_trx's LOCK WAIT was seen to miss it).
    "mysql": "SELECT count(*) FROM information_schema.processlist "
    "WHERE info LIKE 'INSERT INTO scheduler_jobs%%'",
}
#: How long a write may take to reach its lock wait before the test gives up (not a
#: measure: the test goes on as soon as it waits).
REACH_LOCK_S = 60.0


def keeps_tombstones(store: IJobStore) -> bool:
    return not isinstance(store, MinimalStore)


def tombstone_times(store: IJobStore) -> dict[str, datetime]:
    """When each kept tombstone was written, read where the store keeps them."""
    if isinstance(store, SqlJobStore):
        with store.engine.connect() as conn:
            rows = conn.execute(select(purged.c.job_id, purged.c.purged_at))
            return {job_id: when for job_id, when in rows}
    assert isinstance(store, MemoryJobStore)
    return dict(store._purged)


def age_tombstone(store: IJobStore, job_id: str, by: timedelta) -> None:
    """Make ``job_id``'s tombstone ``by`` older (the clock cannot be moved a week)."""
    when = tombstone_times(store)[job_id] - by
    if isinstance(store, SqlJobStore):
        with store.engine.begin() as conn:
            conn.execute(update(purged).where(purged.c.job_id == job_id).values(purged_at=when))
    else:
        assert isinstance(store, MemoryJobStore)
        store._purged[job_id] = when


def insert_by_hand(store: IJobStore, record: JobRecord) -> None:
    """Insert ``record``'s row past ``put`` (which refuses an id with a tombstone), and
    past PostgreSQL's trigger that refuses it too (as a row stored before it was)."""
    if isinstance(store, SqlJobStore):
        with transaction(store.engine) as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(text("SET LOCAL session_replication_role = replica"))
            conn.execute(insert(jobs).values(row_values(record)))
    else:
        assert isinstance(store, MemoryJobStore)
        store._rows[record.id] = record.evolve(version=record.version + 1)


def put_ended(store: IJobStore, *job_ids: str, status: Status = Status.COMPLETED) -> None:
    for job_id in job_ids:
        assert store.put(job(job_id, status=status))


def test_the_purge_leaves_a_tombstone_for_each_row_it_deletes(store: IJobStore) -> None:
    put_ended(store, "gone-1", "gone-2")
    put_ended(store, "failed", status=Status.FAILED)
    put_ended(store, "recent")
    assert store.put(job("recent", status=Status.COMPLETED, version=1, updated=CUTOFF))
    before = utcnow()

    assert sorted(store.purge(Status.COMPLETED, CUTOFF, 100)) == ["gone-1", "gone-2"]

    kept = keeps_tombstones(store)
    assert store.was_purged("gone-1") is kept and store.was_purged("gone-2") is kept
    # Not purged: a row still stored, one of another status, one never stored.
    assert not store.was_purged("recent")
    assert not store.was_purged("failed")
    assert not store.was_purged("never-stored")
    if kept:
        times = tombstone_times(store)
        assert sorted(times) == ["gone-1", "gone-2"]
        assert all(before - timedelta(seconds=5) <= t <= utcnow() for t in times.values())


def test_a_dry_run_and_a_plain_delete_leave_no_tombstone(store: IJobStore) -> None:
    put_ended(store, "old", "deleted")
    assert store.purge(Status.COMPLETED, CUTOFF, 100, dry_run=True) == ["deleted", "old"]
    assert store.delete("deleted")
    assert not store.was_purged("old") and not store.was_purged("deleted")


def test_a_row_the_purge_keeps_leaves_no_tombstone(store: IJobStore) -> None:
    # A Scheduled child waits for the parent: the purge keeps the parent.
    put_ended(store, "parent")
    assert store.put(
        job(
            "child",
            status=Status.SCHEDULED,
            waiting_since=T0,
            waits={"parents": ["parent"], "on_parent_failure": "propagate"},
        )
    )
    assert store.purge(Status.COMPLETED, CUTOFF, 100) == []
    assert not store.was_purged("parent")


@pytest.mark.parametrize("keep", ["past", "within"])
def test_the_purge_deletes_the_tombstones_older_than_the_keep(store: IJobStore, keep: str) -> None:
    if not keeps_tombstones(store):
        pytest.skip("the IJobStore defaults keep no tombstone")
    put_ended(store, "first")
    assert store.purge(Status.COMPLETED, CUTOFF, 100) == ["first"]
    slack = timedelta(minutes=1)
    age_tombstone(
        store, "first", TOMBSTONE_KEEP + slack if keep == "past" else TOMBSTONE_KEEP - slack
    )
    put_ended(store, "second")

    assert store.purge(Status.COMPLETED, CUTOFF, 100) == ["second"]

    assert store.was_purged("first") is (keep == "within")
    assert store.was_purged("second")


def test_a_purge_that_deletes_nothing_still_forgets_old_tombstones(store: IJobStore) -> None:
    if not keeps_tombstones(store):
        pytest.skip("the IJobStore defaults keep no tombstone")
    put_ended(store, "first")
    assert store.purge(Status.COMPLETED, CUTOFF, 100) == ["first"]
    age_tombstone(store, "first", TOMBSTONE_KEEP + timedelta(minutes=1))
    assert store.purge(Status.FAILED, CUTOFF, 100) == []
    assert not store.was_purged("first")


def test_an_id_purged_again_gets_a_fresh_tombstone(store: IJobStore) -> None:
    if not keeps_tombstones(store):
        pytest.skip("the IJobStore defaults keep no tombstone")
    put_ended(store, "again")
    assert store.purge(Status.COMPLETED, CUTOFF, 100) == ["again"]
    age_tombstone(store, "again", TOMBSTONE_KEEP - timedelta(minutes=1))
    insert_by_hand(store, job("again", status=Status.COMPLETED))  # put refuses it
    assert store.purge(Status.COMPLETED, CUTOFF, 100) == ["again"]
    assert utcnow() - tombstone_times(store)["again"] < timedelta(minutes=1)


def test_postgresqls_trigger_refuses_a_purged_id_whatever_inserts_it(store: IJobStore) -> None:
    # Migration 0018's trigger reads the tombstone once a row is in: an insert by any
    # statement (here one without the insert's own check) is refused, naming the job.
    if not isinstance(store, SqlJobStore) or store.engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL's trigger; MySQL reads the tombstone again in put")
    put_ended(store, "gone")
    assert store.purge(Status.COMPLETED, CUTOFF, 100) == ["gone"]
    refused = pytest.raises(sa_exc.DBAPIError, match="job gone was deleted by retention")
    with refused as caught, store.engine.begin() as conn:
        conn.execute(insert(jobs).values(row_values(job("gone"))))
    assert purged_meanwhile(caught.value)
    assert store.get("gone") is None


def test_many_rows_purged_in_batches_each_leave_one(store: IJobStore) -> None:
    if not keeps_tombstones(store):
        pytest.skip("the IJobStore defaults keep no tombstone")
    ids = [f"j{n:04d}" for n in range(1200)]  # more than one purge batch (1,000)
    put_ended(store, *ids)
    assert len(store.purge(Status.COMPLETED, CUTOFF, 2000)) == 1200
    assert sorted(tombstone_times(store)) == ids


def test_an_id_with_a_tombstone_is_never_inserted_again(store: IJobStore) -> None:
    # A late write of a purged job (its producer's Scheduled save, a worker healing
    # its row from a message that came back) would run it again: nothing is inserted.
    put_ended(store, "gone", "parent")
    assert store.purge(Status.COMPLETED, CUTOFF, 1) == ["gone"]
    kept = keeps_tombstones(store)

    late_writes = [
        job("gone", status=Status.SCHEDULED),  # the producer's first save
        job("gone", status=Status.SCHEDULED, version=4),  # a save of a row read before
        job("gone", status=Status.CANCELLED, version=2),  # a cancel's save
        job("gone", status=Status.SCHEDULED, payload={"retry_of": "parent"}),  # with links
    ]
    for record in late_writes:
        assert store.put(record) is not kept, record
        assert (store.get("gone") is None) is kept
        if not kept:  # MinimalStore keeps no tombstone: its put inserts (the default's gap)
            assert store.delete("gone")
    assert store.was_purged("gone") is kept
    # Other ids are inserted as ever.
    assert store.put(job("new", status=Status.SCHEDULED))


def test_an_id_is_inserted_again_once_its_tombstone_expired(store: IJobStore) -> None:
    put_ended(store, "gone")
    assert store.purge(Status.COMPLETED, CUTOFF, 1) == ["gone"]
    if keeps_tombstones(store):
        age_tombstone(store, "gone", TOMBSTONE_KEEP + timedelta(seconds=1))
        put_ended(store, "other")
        assert store.purge(Status.COMPLETED, CUTOFF, 1) == ["other"]  # expires the old ones
    assert store.put(job("gone", status=Status.SCHEDULED))
    assert store.get("gone") is not None


def wait_until_it_waits_on_a_lock(engine: Engine, writer: threading.Thread) -> None:
    """Return once some session of ``engine``'s database waits on a row lock (or the
    ``writer`` is done without waiting: its answer is judged all the same)."""
    query = text(LOCK_WAITERS[engine.dialect.name])
    deadline = time.monotonic() + REACH_LOCK_S
    while time.monotonic() < deadline and writer.is_alive():
        with engine.connect() as conn:
            if conn.execute(query).scalar():
                return
        time.sleep(0.01)
    assert not writer.is_alive(), f"the write neither waited nor ended in {REACH_LOCK_S} s"


@pytest.mark.parametrize(
    "late",
    [
        job("gone", status=Status.SCHEDULED),  # a producer's first save, a heal
        job("gone", status=Status.SCHEDULED, version=3),  # a save of a row read before
        job("gone", status=Status.SCHEDULED, payload={"retry_of": "parent"}),  # with links
    ],
    ids=["first-save", "later-save", "with-links"],
)
@pytest.mark.parametrize("through", ["store", "caller"])
def test_an_insert_waiting_on_the_row_the_purge_deletes_is_refused_too(
    store: IJobStore, late: JobRecord, through: str
) -> None:
    # Issue 25: a write of a purged job that reached the row while the purge held it
    # (deleted, its tombstone written, not yet committed) waits on the row's lock.
    # PostgreSQL read the tombstone before the wait (its statement's snapshot), then
    # inserted the row once the purge committed: the job was stored again, Scheduled.
    # The interleaving is forced: the purge's transaction is held open (its own delete
    # and tombstone, as ``purge`` writes them) until the write waits on the lock. The
    # write goes through the store, or through a caller's transaction (``within``).
    if not isinstance(store, SqlJobStore):
        pytest.skip("a store in memory holds one lock for put and purge: they never interleave")
    put_ended(store, "gone", "parent")
    answer: dict[str, object] = {}

    def late_write() -> None:
        try:
            if through == "store":
                answer["put"] = store.put(late)
                return
            # Transactional enqueue: the write in a caller's transaction (a savepoint).
            caller = create_engine(store.engine.url)
            try:
                with caller.begin() as connection:
                    answer["put"] = store.within(connection).put(late)
            finally:
                caller.dispose()
        except Exception as exc:  # reported below, in the test's thread
            answer["error"] = exc

    writer = threading.Thread(target=late_write)
    with transaction(store.engine) as purge:
        purge.execute(delete(jobs).where(jobs.c.id == "gone"))
        bury(purge, ["gone"])
        writer.start()
        wait_until_it_waits_on_a_lock(store.engine, writer)
        answer["waited"] = writer.is_alive()
    writer.join()

    assert "error" not in answer, answer
    assert answer["waited"], "the write did not wait on the purge's row lock"
    assert answer["put"] is False
    assert store.get("gone") is None
    assert store.was_purged("gone")
    assert store.get("parent") is not None  # the purge took only "gone"
