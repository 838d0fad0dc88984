"""The contract every job store keeps, run unchanged against each of them.

A new store joins by adding a param to :data:`STORES` and a branch to ``store``.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from pypepper_dramatiq.rules.status import TERMINAL, Status
from pypepper_dramatiq.stores.base import (
    IJobStore,
    JobFilter,
    JobRecord,
    retry_past_deadline,
    why_not_claimable,
)
from pypepper_dramatiq.stores.memory import MemoryJobStore

STORES = [
    pytest.param("memory", id="memory"),
    pytest.param("minimal", id="minimal"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    pytest.param("mysql", id="mysql", marks=pytest.mark.mysql),
]

#: The conftest fixture that builds each SQL store.
SQL_FIXTURES = {"postgres": "pg_store", "mysql": "mysql_store"}

T0 = datetime(2024, 1, 1, 12, 0, tzinfo=timezone.utc)

#: Threads racing on one job.
RACERS = 16


class MinimalStore(IJobStore):
    """Only the abstract methods, so the contract also runs ``IJobStore``'s defaults
    (``advance``, ``claim_step``) as a third-party store would inherit them."""

    def __init__(self) -> None:
        self.rows = MemoryJobStore()

    def put(self, record: JobRecord) -> bool:
        return self.rows.put(record)

    def get(self, job_id: str) -> JobRecord | None:
        return self.rows.get(job_id)

    def delete(self, job_id: str) -> bool:
        return self.rows.delete(job_id)

    def list_matching(self, where: JobFilter, **page: Any) -> Sequence[JobRecord]:
        return self.rows.list_matching(where, **page)

    def renew_leases(self, *args: Any, **kwargs: Any) -> Any:
        return self.rows.renew_leases(*args, **kwargs)

    def recover_expired(self, *args: Any, **kwargs: Any) -> Any:
        return self.rows.recover_expired(*args, **kwargs)


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest) -> Iterator[IJobStore]:
    if request.param == "memory":
        memory = MemoryJobStore()
        yield memory
        memory.close()
    elif request.param == "minimal":
        yield MinimalStore()
    else:
        yield request.getfixturevalue(SQL_FIXTURES[request.param])


def job(job_id: str = "job-1", **fields: Any) -> JobRecord:
    fields.setdefault("created", T0)
    fields.setdefault("updated", T0)
    return JobRecord(id=job_id, **fields)


def stored(store: IJobStore, job_id: str = "job-1") -> JobRecord:
    record = store.get(job_id)
    assert record is not None, f"{job_id} is not stored"
    return record


def seed(store: IJobStore, status: Status, job_id: str = "job-1") -> JobRecord:
    """Store a new job directly in ``status`` (inserts are not status-guarded)."""
    assert store.put(job(job_id, status=status))
    return stored(store, job_id)


def pairs(statuses: Any) -> list[Any]:
    return [pytest.param(a, b, id=f"{a}->{b}") for a, b in statuses]


class TestJobStoreContract:
    # -- insert, get, upsert --------------------------------------------------------------

    def test_put_inserts_with_version_1(self, store: IJobStore) -> None:
        record = job(status=Status.SCHEDULED, category="mail", error="none yet")
        assert store.put(record) is True
        assert store.get("job-1") == record.evolve(version=1)

    def test_get_unknown_is_none(self, store: IJobStore) -> None:
        assert store.get("nope") is None

    def test_new_row_stores_seen_version_plus_one(self, store: IJobStore) -> None:
        assert store.put(job(version=4))
        assert stored(store).version == 5

    def test_upsert_by_id(self, store: IJobStore) -> None:
        assert store.put(job(status=Status.SCHEDULED, channel_id="a"))
        later = T0 + timedelta(seconds=5)
        update = job(
            status=Status.IN_PROGRESS,
            version=1,
            channel_id="b",
            category="cat",
            updated=later,
            payload={"workflows": []},
            state={"cursor": [0, 0, 0, 1]},
            error="Boom: once",
        )
        assert store.put(update)
        assert store.get("job-1") == update.evolve(version=2)
        assert len(store.list()) == 1

    def test_update_needs_matching_version_and_increments_it(self, store: IJobStore) -> None:
        assert store.put(job(status=Status.SCHEDULED))
        for seen in (1, 2, 3):
            assert store.put(job(status=Status.SCHEDULED, version=seen, state={"n": seen}))
            assert stored(store).version == seen + 1
        assert stored(store).state == {"n": 3}

    @pytest.mark.parametrize("seen", [0, 1, 3, 10])
    def test_stale_or_unknown_version_is_refused(self, store: IJobStore, seen: int) -> None:
        assert store.put(job(status=Status.SCHEDULED))
        assert store.put(job(status=Status.SCHEDULED, version=1))
        before = stored(store)
        assert store.put(job(status=Status.IN_PROGRESS, version=seen, error="x")) is False
        assert stored(store) == before

    def test_created_is_never_overwritten(self, store: IJobStore) -> None:
        assert store.put(job(status=Status.SCHEDULED))
        moved = job(status=Status.IN_PROGRESS, version=1, created=T0 + timedelta(days=1))
        assert store.put(moved)
        assert stored(store).created == T0

    def test_timestamps_round_trip_as_instants(self, store: IJobStore) -> None:
        plus2 = timezone(timedelta(hours=2))
        created = datetime(2024, 3, 1, 10, 30, 15, 123456, tzinfo=plus2)
        assert store.put(job(created=created, updated=created))
        record = stored(store)
        assert record.created == created and record.updated == created
        assert record.created.utcoffset() is not None

    # -- status rules ---------------------------------------------------------------------

    @pytest.mark.parametrize("durable", [Status.IN_PROGRESS, *sorted(TERMINAL)])
    def test_scheduled_cannot_overwrite_later_statuses(
        self, store: IJobStore, durable: Status
    ) -> None:
        before = seed(store, durable)
        assert store.put(job(status=Status.SCHEDULED, version=1)) is False
        assert stored(store) == before

    @pytest.mark.parametrize("durable", sorted(TERMINAL))
    def test_in_progress_cannot_overwrite_terminals(
        self, store: IJobStore, durable: Status
    ) -> None:
        before = seed(store, durable)
        assert store.put(job(status=Status.IN_PROGRESS, version=1)) is False
        assert stored(store) == before

    @pytest.mark.parametrize(("durable", "new"), pairs(itertools.permutations(sorted(TERMINAL), 2)))
    def test_distinct_terminals_never_overwrite_each_other(
        self, store: IJobStore, durable: Status, new: Status
    ) -> None:
        before = seed(store, durable)
        assert store.put(job(status=new, version=1)) is False
        assert stored(store) == before

    @pytest.mark.parametrize("terminal", sorted(TERMINAL))
    def test_same_terminal_may_be_saved_again(self, store: IJobStore, terminal: Status) -> None:
        seed(store, terminal)
        assert store.put(job(status=terminal, version=1, error="again"))
        assert stored(store).version == 2
        assert stored(store).error == "again"
        assert store.put(job(status=terminal, version=1)) is False

    def test_scheduled_in_progress_completed(self, store: IJobStore) -> None:
        path = [Status.SCHEDULED, Status.IN_PROGRESS, Status.IN_PROGRESS, Status.COMPLETED]
        for seen, status in enumerate(path):
            assert store.put(job(status=status, version=seen))
        assert (stored(store).status, stored(store).version) == (Status.COMPLETED, 4)

    def test_failed_directly_over_scheduled(self, store: IJobStore) -> None:
        seed(store, Status.SCHEDULED)
        assert store.put(job(status=Status.FAILED, version=1, error="ValueError: bad"))
        assert stored(store).status is Status.FAILED

    def test_cancelled_over_in_progress(self, store: IJobStore) -> None:
        seed(store, Status.IN_PROGRESS)
        assert store.put(job(status=Status.CANCELLED, version=1))
        assert stored(store).status is Status.CANCELLED

    # -- delete and list ------------------------------------------------------------------

    def test_delete(self, store: IJobStore) -> None:
        seed(store, Status.SCHEDULED)
        assert store.delete("job-1") is True
        assert store.get("job-1") is None
        assert store.delete("job-1") is False
        assert store.put(job(status=Status.SCHEDULED)), "a deleted id can be inserted anew"
        assert stored(store).version == 1

    def test_list_filters_orders_and_limits(self, store: IJobStore) -> None:
        rows = [
            ("c", 3, "ch1", "mail", Status.SCHEDULED),
            ("a", 0, "ch1", "mail", Status.SCHEDULED),
            ("b", 0, "ch2", None, Status.SCHEDULED),  # same created as "a": id breaks the tie
            ("d", 1, "ch1", "report", Status.IN_PROGRESS),
            ("e", 2, "ch2", "mail", Status.FAILED),
        ]
        for job_id, minutes, channel, category, status in rows:
            created = T0 + timedelta(minutes=minutes)
            assert store.put(
                job(job_id, created=created, channel_id=channel, category=category, status=status)
            )

        def ids(**filters: Any) -> list[str]:
            return [r.id for r in store.list(**filters)]

        assert ids() == ["a", "b", "d", "e", "c"]
        assert ids(limit=2) == ["a", "b"]
        assert ids(limit=0) == []
        assert ids(status=Status.SCHEDULED) == ["a", "b", "c"]
        assert ids(status="Scheduled") == ["a", "b", "c"]
        assert ids(channel_id="ch1") == ["a", "d", "c"]
        assert ids(category="mail") == ["a", "e", "c"]
        assert ids(channel_id="ch1", status=Status.SCHEDULED, category="mail") == ["a", "c"]
        assert ids(channel_id="ch1", status=Status.SCHEDULED, limit=1) == ["a"]
        assert ids(channel_id="nowhere") == []
        assert all(isinstance(r, JobRecord) for r in store.list())

    def _seed_for_paging(self, store: IJobStore) -> None:
        """Seven rows: "a".."g", two pairs created at the same instant (id breaks the tie)."""
        rows = [
            ("a", 0, Status.FAILED, "mail"),
            ("b", 1, Status.COMPLETED, "mail"),
            ("c", 1, Status.FAILED, "report"),
            ("d", 2, Status.FAILED, "mail"),
            ("e", 3, Status.SCHEDULED, None),
            ("f", 3, Status.FAILED, "mail"),
            ("g", 4, Status.FAILED, "mail"),
        ]
        for job_id, minutes, status, category in rows:
            assert store.put(
                job(
                    job_id,
                    created=T0 + timedelta(minutes=minutes),
                    status=status,
                    category=category,
                )
            )

    def test_list_newest_first(self, store: IJobStore) -> None:
        self._seed_for_paging(store)

        def ids(**options: Any) -> list[str]:
            return [r.id for r in store.list(newest_first=True, **options)]

        assert ids() == ["g", "f", "e", "d", "c", "b", "a"]
        assert ids(limit=3) == ["g", "f", "e"]
        assert ids(status=Status.FAILED) == ["g", "f", "d", "c", "a"]
        assert ids(category="mail", limit=2) == ["g", "f"]
        assert [r.id for r in store.list()] == ["a", "b", "c", "d", "e", "f", "g"]  # default

    def test_list_before_a_cursor_pages_without_gaps_or_repeats(self, store: IJobStore) -> None:
        self._seed_for_paging(store)
        pages: list[list[str]] = []
        cursor: tuple[datetime, str] | None = None
        while True:
            page = store.list(status=Status.FAILED, newest_first=True, before=cursor, limit=2)
            if not page:
                break
            pages.append([r.id for r in page])
            cursor = (page[-1].created, page[-1].id)
        assert pages == [["g", "f"], ["d", "c"], ["a"]]

        # A row created meanwhile does not shift later pages (it is newer than the cursor).
        assert store.put(job("h", created=T0 + timedelta(minutes=9), status=Status.FAILED))
        page = store.list(
            status=Status.FAILED,
            newest_first=True,
            limit=2,
            before=(T0 + timedelta(minutes=3), "f"),
        )
        assert [r.id for r in page] == ["d", "c"]

    def test_list_before_is_strict_and_breaks_ties_by_id(self, store: IJobStore) -> None:
        self._seed_for_paging(store)
        same_instant = T0 + timedelta(minutes=3)  # "e" and "f"

        def ids(**options: Any) -> list[str]:
            return [r.id for r in store.list(**options)]

        assert ids(newest_first=True, before=(same_instant, "f")) == ["e", "d", "c", "b", "a"]
        assert ids(newest_first=True, before=(same_instant, "e")) == ["d", "c", "b", "a"]
        assert ids(newest_first=True, before=(same_instant, "zzz"), limit=2) == ["f", "e"]
        assert ids(before=(same_instant, "f")) == ["a", "b", "c", "d", "e"]  # oldest first too
        assert ids(before=(T0, "a")) == []
        # The same instant in another zone is the same cursor.
        plus_two = timezone(timedelta(hours=2))
        assert ids(newest_first=True, before=(same_instant.astimezone(plus_two), "f"), limit=1) == [
            "e"
        ]

    def test_list_after_pages_oldest_first_and_is_strict(self, store: IJobStore) -> None:
        self._seed_for_paging(store)
        same_instant = T0 + timedelta(minutes=3)  # "e" and "f"

        def ids(**options: Any) -> list[str]:
            return [r.id for r in store.list(**options)]

        assert ids(after=(same_instant, "e")) == ["f", "g"]
        assert ids(after=(T0, "a"), limit=2) == ["b", "c"]
        assert ids(after=(T0 - timedelta(days=1), "z")) == ["a", "b", "c", "d", "e", "f", "g"]
        assert ids(after=(same_instant, "f"), status=Status.FAILED) == ["g"]
        assert ids(after=(T0 + timedelta(minutes=4), "g")) == []

    # -- start times ------------------------------------------------------------------------

    def test_start_times_round_trip_through_put_and_advance(self, store: IJobStore) -> None:
        times = {
            "not_before": T0 + timedelta(minutes=5),
            "release_at": T0 + timedelta(minutes=5),
            "start_deadline": T0 + timedelta(minutes=6, microseconds=250),
        }
        assert store.put(job(status=Status.SCHEDULED, **times))
        row = stored(store)
        assert {k: getattr(row, k) for k in times} == times
        assert store.advance(row.evolve(release_at=None))
        assert stored(store).release_at is None
        assert stored(store).not_before == times["not_before"]

    def test_due_releases_lists_held_scheduled_jobs_due_soonest_first(
        self, store: IJobStore
    ) -> None:
        rows = [
            ("later", Status.SCHEDULED, T0 + timedelta(minutes=9)),
            ("due", Status.SCHEDULED, T0 + timedelta(minutes=1)),
            ("sooner", Status.SCHEDULED, T0),
            ("sent", Status.SCHEDULED, None),
            ("running", Status.IN_PROGRESS, T0),
        ]
        for job_id, status, release_at in rows:
            assert store.put(job(job_id, status=status, release_at=release_at))
        until = T0 + timedelta(minutes=2)
        assert [r.id for r in store.due_releases(until)] == ["sooner", "due"]
        assert [r.id for r in store.due_releases(until, limit=1)] == ["sooner"]

    def test_held_counts_counts_held_scheduled_jobs_by_channel_and_reason(
        self, store: IJobStore
    ) -> None:
        assert store.put(job("parent", channel_id="a", status=Status.IN_PROGRESS))
        waits = {"parents": ["parent"], "held": True}
        rows = [
            ("a-time-1", "a", Status.SCHEDULED, T0, None),
            ("a-time-2", "a", Status.SCHEDULED, T0 + timedelta(hours=1), None),
            ("a-jobs", "a", Status.SCHEDULED, None, T0),
            ("b-jobs", "b", Status.SCHEDULED, T0, T0),  # waiting wins over a time
            ("b-sent", "b", Status.SCHEDULED, None, None),
            ("b-ended", "b", Status.CANCELLED, T0, None),
        ]
        for job_id, channel, status, release_at, waiting_since in rows:
            fields: dict[str, Any] = {"waits": waits} if waiting_since else {}
            record = job(
                job_id,
                channel_id=channel,
                status=status,
                release_at=release_at,
                waiting_since=waiting_since,
                **fields,
            )
            assert store.put(record)
        assert store.held_counts() == {("a", "time"): 2, ("a", "jobs"): 1, ("b", "jobs"): 1}

    def test_overdue_lists_scheduled_jobs_past_their_deadline(self, store: IJobStore) -> None:
        rows = [
            ("late", Status.SCHEDULED, T0 - timedelta(seconds=1)),
            ("later", Status.SCHEDULED, T0 - timedelta(minutes=5)),
            ("in-time", Status.SCHEDULED, T0 + timedelta(seconds=1)),
            ("none", Status.SCHEDULED, None),
            ("started", Status.IN_PROGRESS, T0 - timedelta(minutes=9)),
        ]
        for job_id, status, deadline in rows:
            assert store.put(job(job_id, status=status, start_deadline=deadline))
        assert [r.id for r in store.overdue(T0)] == ["later", "late"]

    # -- JSON ------------------------------------------------------------------------------

    def test_payload_and_state_round_trip(self, store: IJobStore) -> None:
        payload = {
            "workflows": [{"tasks": [{"executor_id": "mail.send", "args": [1, 2.5, None]}]}],
            "text": 'héllo ✓ "quoted" \\ back',
            "flags": {"on": True, "off": False},
            "big": 2**53,
        }
        state = {"cursor": [0, 1, 0, 0], "results": {"t1": {"ok": 1}}, "attempts": {"t1": 2}}
        assert store.put(job(payload=payload, state=state))
        record = stored(store)
        assert record.payload == payload
        assert record.state == state

    def test_empty_json_defaults(self, store: IJobStore) -> None:
        assert store.put(job())
        record = stored(store)
        assert record.payload is None
        assert record.state == {}

    # -- races ------------------------------------------------------------------------------

    def _race(self, store: IJobStore, record: JobRecord) -> list[bool]:
        barrier = threading.Barrier(RACERS)

        def racer(_: int) -> bool:
            barrier.wait(timeout=30)
            return store.put(record)

        with ThreadPoolExecutor(max_workers=RACERS) as pool:
            return list(pool.map(racer, range(RACERS)))

    def test_race_on_update_has_one_winner(self, store: IJobStore) -> None:
        seed(store, Status.SCHEDULED)
        results = self._race(store, job(status=Status.IN_PROGRESS, version=1))
        assert results.count(True) == 1
        assert stored(store).version == 2

    def test_race_on_insert_has_one_winner(self, store: IJobStore) -> None:
        results = self._race(store, job("fresh", status=Status.SCHEDULED, version=0))
        assert results.count(True) == 1
        assert stored(store, "fresh").version == 1


#: Threads racing to recover the same lapsed leases.
RECOVERERS = 8

#: When the lease tests look at the clock; leases before it have lapsed.
NOW = T0 + timedelta(hours=1)

#: The new deadline recovery sets.
LEASE_UNTIL = NOW + timedelta(minutes=5)


def leased(
    store: IJobStore,
    job_id: str,
    *,
    owner: str | None = "worker-a",
    expires: datetime | None = NOW - timedelta(minutes=1),
    status: Status = Status.IN_PROGRESS,
) -> JobRecord:
    """Store a new job holding a lease (by default InProgress and lapsed at :data:`NOW`)."""
    assert store.put(job(job_id, status=status, lease_owner=owner, lease_expires=expires))
    return stored(store, job_id)


class TestLeaseContract:
    # -- round trip -------------------------------------------------------------------------

    def test_lease_fields_round_trip(self, store: IJobStore) -> None:
        expires = datetime(2024, 3, 1, 10, 30, 15, 123456, tzinfo=timezone(timedelta(hours=2)))
        record = job(status=Status.IN_PROGRESS, lease_owner="host:42", lease_expires=expires)
        assert store.put(record)
        assert stored(store) == record.evolve(version=1)
        assert stored(store).lease_expires == expires
        assert store.list()[0].lease_owner == "host:42"

    def test_put_updates_and_clears_the_lease(self, store: IJobStore) -> None:
        assert store.put(job(status=Status.SCHEDULED))
        assert stored(store).lease_owner is None and stored(store).lease_expires is None
        taken = job(status=Status.IN_PROGRESS, version=1, lease_owner="a", lease_expires=NOW)
        assert store.put(taken)
        assert stored(store) == taken.evolve(version=2)
        freed = job(status=Status.IN_PROGRESS, version=2)
        assert store.put(freed)
        assert stored(store) == freed.evolve(version=3)

    # -- renew_leases -------------------------------------------------------------------------

    def test_renew_extends_only_the_owners_leases(self, store: IJobStore) -> None:
        mine = leased(store, "mine")
        theirs = leased(store, "theirs", owner="worker-b")
        free = leased(store, "free", owner=None, expires=None)
        until = NOW + timedelta(minutes=10)
        renewed = store.renew_leases("worker-a", ["mine", "theirs", "free"], until)
        assert renewed == {"mine": Status.IN_PROGRESS}
        assert stored(store, "mine") == mine.evolve(lease_expires=until)
        assert stored(store, "theirs") == theirs
        assert stored(store, "free") == free

    def test_renew_leaves_version_alone(self, store: IJobStore) -> None:
        before = leased(store, "job-1")
        assert store.renew_leases("worker-a", ["job-1"], LEASE_UNTIL) == {
            "job-1": Status.IN_PROGRESS
        }
        assert stored(store).version == before.version
        # so the owner's next write, made with the version it saw, still lands
        assert store.put(before.evolve(status=Status.COMPLETED, lease_owner=None))

    def test_renew_reports_each_status(self, store: IJobStore) -> None:
        leased(store, "running")
        leased(store, "cancelled", status=Status.CANCELLED)
        leased(store, "scheduled", status=Status.SCHEDULED)
        renewed = store.renew_leases("worker-a", ("running", "cancelled", "scheduled"), NOW)
        assert renewed == {
            "running": Status.IN_PROGRESS,
            "cancelled": Status.CANCELLED,
            "scheduled": Status.SCHEDULED,
        }
        assert all(isinstance(status, Status) for status in renewed.values())

    def test_renew_ignores_unknown_ids(self, store: IJobStore) -> None:
        leased(store, "job-1")
        renewed = store.renew_leases("worker-a", {"job-1", "gone", "x" * 80}, LEASE_UNTIL)
        assert renewed == {"job-1": Status.IN_PROGRESS}
        assert store.renew_leases("worker-a", ["gone"], LEASE_UNTIL) == {}

    def test_renew_nothing(self, store: IJobStore) -> None:
        before = leased(store, "job-1")
        assert store.renew_leases("worker-a", [], LEASE_UNTIL) == {}
        assert stored(store) == before

    # -- recover_expired ----------------------------------------------------------------------

    def test_recover_takes_only_lapsed_in_progress_rows(self, store: IJobStore) -> None:
        lapsed = leased(store, "lapsed")
        untouched = [
            leased(store, "scheduled", status=Status.SCHEDULED),
            *(leased(store, f"{s.value.lower()}", status=s) for s in sorted(TERMINAL)),
            leased(store, "no-lease", owner=None, expires=None),
            leased(store, "unexpired", expires=NOW + timedelta(seconds=1)),
            leased(store, "expires-now", expires=NOW),  # lapsed *before* now only
        ]
        recovered = store.recover_expired(NOW, LEASE_UNTIL)
        expected = lapsed.evolve(
            lease_owner=None, lease_expires=LEASE_UNTIL, version=lapsed.version + 1
        )
        assert recovered == [expected]
        assert stored(store, "lapsed") == expected
        for before in untouched:
            assert stored(store, before.id) == before

    def test_lapsed_lease_without_owner_is_recovered(self, store: IJobStore) -> None:
        leased(store, "job-1", owner=None)
        assert [r.id for r in store.recover_expired(NOW, LEASE_UNTIL)] == ["job-1"]

    def test_recovery_fences_the_previous_owner(self, store: IJobStore) -> None:
        before = leased(store, "job-1")
        store.recover_expired(NOW, LEASE_UNTIL)
        assert store.put(before.evolve(status=Status.COMPLETED)) is False
        assert store.renew_leases("worker-a", ["job-1"], LEASE_UNTIL) == {}
        assert stored(store).status is Status.IN_PROGRESS

    def test_recovered_row_is_not_recovered_again(self, store: IJobStore) -> None:
        leased(store, "job-1")
        assert len(store.recover_expired(NOW, LEASE_UNTIL)) == 1
        assert store.recover_expired(NOW, LEASE_UNTIL) == []
        # ...until the new lease lapses in its turn
        later = LEASE_UNTIL + timedelta(seconds=1)
        again = store.recover_expired(later, later + timedelta(minutes=5))
        assert [(r.id, r.version) for r in again] == [("job-1", 3)]

    def test_recover_takes_the_oldest_first_up_to_limit(self, store: IJobStore) -> None:
        ages = {"m3": 3, "m9": 9, "m1": 1, "m7": 7, "m5": 5}
        for job_id, minutes in ages.items():
            leased(store, job_id, expires=NOW - timedelta(minutes=minutes))
        first = store.recover_expired(NOW, LEASE_UNTIL, limit=2)
        assert sorted(r.id for r in first) == ["m7", "m9"]
        second = store.recover_expired(NOW, LEASE_UNTIL, limit=2)
        assert sorted(r.id for r in second) == ["m3", "m5"]
        assert [r.id for r in store.recover_expired(NOW, LEASE_UNTIL, limit=2)] == ["m1"]
        assert store.recover_expired(NOW, LEASE_UNTIL, limit=2) == []

    def test_recover_with_nothing_lapsed(self, store: IJobStore) -> None:
        assert store.recover_expired(NOW, LEASE_UNTIL) == []

    # -- race -----------------------------------------------------------------------------------

    @pytest.mark.parametrize("limit", [100, 3], ids=["one-batch", "small-batches"])
    def test_concurrent_recoverers_share_out_each_row_once(
        self, store: IJobStore, limit: int
    ) -> None:
        ids = [f"lapsed-{i:02d}" for i in range(20)]
        for i, job_id in enumerate(ids):
            leased(store, job_id, expires=NOW - timedelta(seconds=i + 1))
        barrier = threading.Barrier(RECOVERERS)

        def recoverer(_: int) -> list[JobRecord]:
            barrier.wait(timeout=30)
            taken: list[JobRecord] = []
            # Until nothing is left: with small batches the recoverers overlap longer.
            while batch := store.recover_expired(NOW, LEASE_UNTIL, limit=limit):
                taken.extend(batch)
            return taken

        with ThreadPoolExecutor(max_workers=RECOVERERS) as pool:
            results = list(pool.map(recoverer, range(RECOVERERS)))
        recovered = sorted(r.id for taken in results for r in taken)
        assert recovered == ids, "every lapsed row recovered exactly once"
        for job_id in ids:
            record = stored(store, job_id)
            assert (record.version, record.lease_owner, record.lease_expires) == (
                2,
                None,
                LEASE_UNTIL,
            )


class TestAdvanceContract:
    """``advance``: the guarded update of a running job's row, payload left alone."""

    def test_advance_updates_state_and_keeps_payload_and_created(self, store: IJobStore) -> None:
        assert store.put(job(status=Status.SCHEDULED, payload={"workflows": [{"tasks": []}]}))
        row = stored(store)
        later = T0 + timedelta(minutes=5)
        moved = row.evolve(
            status=Status.IN_PROGRESS,
            state={"cursor": [0, 1, 0, 0]},
            payload=None,
            created=later,
            updated=later,
            lease_owner="w",
            lease_expires=later,
        )
        assert store.advance(moved) is True
        after = stored(store)
        assert after.version == row.version + 1
        assert after.status is Status.IN_PROGRESS and after.state == {"cursor": [0, 1, 0, 0]}
        assert after.payload == {"workflows": [{"tasks": []}]}  # not part of an advance
        assert after.created == T0 and after.updated == later
        assert after.lease_owner == "w" and after.lease_expires == later

    def test_advance_needs_an_existing_row(self, store: IJobStore) -> None:
        assert store.advance(job("nobody", status=Status.IN_PROGRESS)) is False
        assert store.get("nobody") is None

    def test_advance_keeps_the_put_rules(self, store: IJobStore) -> None:
        seed(store, Status.COMPLETED)
        row = stored(store)
        assert store.advance(row.evolve(status=Status.IN_PROGRESS)) is False  # moves back
        assert store.advance(row.evolve(status=Status.FAILED)) is False  # another terminal
        assert store.advance(row.evolve(version=row.version - 1)) is False  # stale
        assert stored(store).version == row.version

    def test_advance_many_decides_each_row_alone_and_answers_in_order(
        self, store: IJobStore
    ) -> None:
        for job_id in ("b", "a", "c"):
            assert store.put(
                job(job_id, status=Status.SCHEDULED, payload={"workflows": [{"tasks": []}]})
            )
        b, a, c = (stored(store, job_id) for job_id in ("b", "a", "c"))
        later = T0 + timedelta(minutes=1)
        answers = store.advance_many(
            [
                b.evolve(state={"mark": "b"}, updated=later),
                a.evolve(state={"mark": "a"}, version=a.version + 7),  # stale: refused
                job("nobody", status=Status.SCHEDULED),  # no row: refused
                c.evolve(status=Status.IN_PROGRESS, payload=None),
            ]
        )
        assert answers == [True, False, False, True]
        assert stored(store, "b").state == {"mark": "b"}
        assert stored(store, "b").version == b.version + 1
        assert stored(store, "a") == a  # the refused row is untouched...
        assert stored(store, "c").status is Status.IN_PROGRESS  # ...and did not stop the next
        assert stored(store, "c").payload == {"workflows": [{"tasks": []}]}
        assert store.get("nobody") is None
        assert store.advance_many([]) == []


class TestClaimStepContract:
    """``claim_step``: one compare-and-set that takes a step, on every store alike."""

    NOW = T0 + timedelta(hours=1)
    UNTIL = NOW + timedelta(seconds=30)

    def running(self, store: IJobStore, **fields: Any) -> JobRecord:
        fields.setdefault("state", {"cursor": [0, 1, 0, 0], "results": {"0.0": 1}})
        assert store.put(job(status=Status.IN_PROGRESS, payload={"workflows": []}, **fields))
        return stored(store)

    def claim(self, store: IJobStore, cursor: list[int], start: bool = False) -> Any:
        return store.claim_step("job-1", cursor, "me", self.NOW, self.UNTIL, start=start)

    def test_starts_a_scheduled_job(self, store: IJobStore) -> None:
        assert store.put(job(status=Status.SCHEDULED, payload={"workflows": [{"tasks": []}]}))
        claimed = self.claim(store, [0, 0, 0, 0], start=True)
        row = stored(store)
        assert claimed == row
        assert row.status is Status.IN_PROGRESS and row.version == 2
        assert row.state["cursor"] == [0, 0, 0, 0] and row.payload == {"workflows": [{"tasks": []}]}
        assert row.lease_owner == "me" and row.lease_expires == self.UNTIL
        assert row.updated == self.NOW

    def test_a_scheduled_job_is_not_started_without_start(self, store: IJobStore) -> None:
        assert store.put(job(status=Status.SCHEDULED))
        assert self.claim(store, [0, 0, 0, 0]) is None
        assert stored(store).status is Status.SCHEDULED

    def test_takes_a_free_step_at_its_cursor_keeping_the_state(self, store: IJobStore) -> None:
        before = self.running(store)
        claimed = self.claim(store, [0, 1, 0, 0])
        assert claimed is not None and claimed.version == before.version + 1
        assert claimed.state == {"cursor": [0, 1, 0, 0], "results": {"0.0": 1}}
        assert stored(store) == claimed

    def test_refuses_another_cursor(self, store: IJobStore) -> None:
        before = self.running(store)
        assert self.claim(store, [0, 0, 0, 0]) is None
        assert self.claim(store, [0, 1, 0, 1]) is None
        assert stored(store) == before

    def test_refuses_a_live_lease_and_takes_a_lapsed_one(self, store: IJobStore) -> None:
        self.running(store, lease_owner="other", lease_expires=self.NOW + timedelta(seconds=1))
        assert self.claim(store, [0, 1, 0, 0]) is None
        store.delete("job-1")
        self.running(store, lease_owner="other", lease_expires=self.NOW - timedelta(seconds=1))
        claimed = self.claim(store, [0, 1, 0, 0])
        assert claimed is not None and claimed.lease_owner == "me"

    @pytest.mark.parametrize("status", sorted(TERMINAL, key=str))
    def test_refuses_finished_and_missing_jobs(self, store: IJobStore, status: Status) -> None:
        assert self.claim(store, [0, 0, 0, 0], start=True) is None
        seed(store, status)
        assert self.claim(store, [0, 0, 0, 0], start=True) is None
        assert stored(store).status is status

    # -- retries keep the job's start deadline ------------------------------------------

    @pytest.mark.parametrize(
        "cursor", [[0, 1, 0, 1], [0, 1, 1, 0]], ids=["later-attempt", "later-round"]
    )
    def test_refuses_a_retry_after_the_start_deadline(
        self, store: IJobStore, cursor: list[int]
    ) -> None:
        passed = self.NOW - timedelta(milliseconds=1)
        before = self.running(store, state={"cursor": cursor}, start_deadline=passed)
        assert self.claim(store, cursor) is None
        assert stored(store) == before
        assert retry_past_deadline(before, cursor, self.NOW)
        assert why_not_claimable(before, cursor, self.NOW, False) == (
            f"a retry after its start deadline passed at {passed.isoformat()}"
        )

    @pytest.mark.parametrize(
        ("cursor", "deadline"),
        [
            ([0, 1, 0, 1], timedelta(0)),  # exactly at the deadline: still in time
            ([0, 1, 0, 1], timedelta(seconds=5)),
            ([0, 1, 0, 0], timedelta(seconds=-5)),  # the next task's first attempt
        ],
        ids=["retry-at-the-deadline", "retry-before", "first-attempt-after"],
    )
    def test_takes_a_retry_in_time_and_any_first_attempt(
        self, store: IJobStore, cursor: list[int], deadline: timedelta
    ) -> None:
        record = self.running(store, state={"cursor": cursor}, start_deadline=self.NOW + deadline)
        assert not retry_past_deadline(record, cursor, self.NOW)
        claimed = self.claim(store, cursor)
        assert claimed is not None and claimed.lease_owner == "me"
        assert claimed.start_deadline == self.NOW + deadline

    def test_a_held_late_retry_is_not_one_to_cancel(self, store: IJobStore) -> None:
        """A live lease: the retry runs somewhere; the deadline does not interrupt it."""
        cursor = [0, 1, 0, 1]
        record = self.running(
            store,
            state={"cursor": cursor},
            start_deadline=self.NOW - timedelta(seconds=5),
            lease_owner="other",
            lease_expires=self.NOW + timedelta(seconds=5),
        )
        assert self.claim(store, cursor) is None
        assert not retry_past_deadline(record, cursor, self.NOW)
        assert not retry_past_deadline(record, [0, 1, 0, 2], self.NOW)  # stale: not its step

    def test_exactly_one_of_racing_claims_wins(self, store: IJobStore) -> None:
        self.running(store)
        barrier = threading.Barrier(8)

        def race(n: int) -> bool:
            barrier.wait()
            owner = f"worker-{n}"
            return store.claim_step("job-1", [0, 1, 0, 0], owner, self.NOW, self.UNTIL) is not None

        with ThreadPoolExecutor(8) as pool:
            wins = list(pool.map(race, range(8)))
        assert wins.count(True) == 1
        assert stored(store).lease_owner == f"worker-{wins.index(True)}"
