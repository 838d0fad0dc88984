"""The store contract of unique keys, waits and recurring schedules, run against each store.

Reuses the stores of :mod:`.test_store_contract` (memory, the abstract defaults of
``IJobStore`` through ``MinimalStore``, PostgreSQL, MariaDB); recurring schedules
run on the stores that keep them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import delete

from pypepper_dramatiq.errors import DuplicateJobError, StoreError
from pypepper_dramatiq.records.recurring import RecurringSchedule
from pypepper_dramatiq.rules.status import TERMINAL, Status
from pypepper_dramatiq.stores.base import IJobStore, JobRecord
from pypepper_dramatiq.stores.memory import MemoryJobStore
from pypepper_dramatiq.stores.schema import recurring
from pypepper_dramatiq.stores.sql import SqlJobStore

from .test_store_contract import SQL_FIXTURES, STORES, T0, MinimalStore, job, stored

#: The stores that keep recurring schedules (``MinimalStore`` inherits the refusing defaults).
KEEPERS = [param for param in STORES if param.values != ("minimal",)]

#: When the claim and recurring tests look at the clock.
NOW = T0 + timedelta(hours=1)
LEASE_UNTIL = NOW + timedelta(seconds=30)

KEY = "report:2024-01"
WAITS = {"parents": ["p"], "on_parent_failure": "propagate"}
ACTIVE = [Status.SCHEDULED, Status.IN_PROGRESS]
TERMINALS = sorted(TERMINAL)

#: Threads racing for one unique key.
RACERS = 8


def _fresh(store: IJobStore) -> IJobStore:
    """``store`` with no recurring schedule left by an earlier test (SQL tables persist)."""
    if isinstance(store, SqlJobStore):
        with store.engine.begin() as connection:
            connection.execute(delete(recurring))
    return store


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest) -> Iterator[IJobStore]:
    if request.param == "memory":
        memory = MemoryJobStore()
        yield memory
        memory.close()
    elif request.param == "minimal":
        yield MinimalStore()
    else:
        yield _fresh(request.getfixturevalue(SQL_FIXTURES[request.param]))


@pytest.fixture(params=KEEPERS)
def keeper(request: pytest.FixtureRequest) -> Iterator[IJobStore]:
    """A store that keeps recurring schedules, with none stored."""
    if request.param == "memory":
        memory = MemoryJobStore()
        yield memory
        memory.close()
    else:
        yield _fresh(request.getfixturevalue(SQL_FIXTURES[request.param]))


def keyed(
    job_id: str, status: Status = Status.SCHEDULED, key: str | None = KEY, **fields: Any
) -> JobRecord:
    return job(job_id, status=status, unique_key=key, **fields)


def holder_of(store: IJobStore, key: str = KEY) -> str | None:
    row = store.key_holder(key)
    return None if row is None else row.id


class TestUniqueKeys:
    @pytest.mark.parametrize("holding", ACTIVE)
    @pytest.mark.parametrize("newcomer", ACTIVE)
    def test_a_second_active_job_cannot_take_a_held_key(
        self, store: IJobStore, holding: Status, newcomer: Status
    ) -> None:
        assert store.put(keyed("first", holding))
        first = stored(store, "first")
        with pytest.raises(DuplicateJobError) as refused:
            store.put(keyed("second", newcomer))
        assert refused.value.existing_id == "first"
        assert refused.value.unique_key == KEY
        assert store.get("second") is None
        assert stored(store, "first") == first
        assert holder_of(store) == "first"

    @pytest.mark.parametrize("write", ["advance", "put"])
    @pytest.mark.parametrize("end", TERMINALS)
    def test_the_key_is_free_once_its_holder_ended(
        self, store: IJobStore, end: Status, write: str
    ) -> None:
        assert store.put(keyed("first"))
        ended = stored(store, "first").evolve(status=end, updated=T0 + timedelta(minutes=1))
        assert getattr(store, write)(ended) is True
        assert holder_of(store) is None
        assert store.put(keyed("second")) is True
        assert holder_of(store) == "second"
        assert stored(store, "first").unique_key == KEY, "the ended row keeps its key"

    def test_an_ended_job_does_not_hold_its_key(self, store: IJobStore) -> None:
        # Inserted ended, with the key of an active job: no conflict either way.
        assert store.put(keyed("holder"))
        for end in TERMINALS:
            assert store.put(keyed(f"ended-{end.value}", end)) is True
        assert holder_of(store) == "holder"

    def test_different_keys_coexist(self, store: IJobStore) -> None:
        assert store.put(keyed("a", key="k1"))
        assert store.put(keyed("b", key="k2"))
        assert store.put(keyed("c", Status.IN_PROGRESS, key="k3"))
        assert store.put(keyed("d", key="k1-and-more"))
        assert [holder_of(store, k) for k in ("k1", "k2", "k3", "k1-and-more")] == list("abcd")
        assert holder_of(store, "k4") is None

    @pytest.mark.parametrize(
        ("one", "other"),
        [("key", "KEY"), ("key", "key "), ("cle", "clé")],
        ids=["case", "trailing-space", "accent"],
    )
    def test_keys_are_compared_exactly(self, store: IJobStore, one: str, other: str) -> None:
        assert store.put(keyed("one", key=one))
        assert store.put(keyed("other", key=other))
        assert holder_of(store, one) == "one"
        assert holder_of(store, other) == "other"

    def test_the_longest_key_is_held(self, store: IJobStore) -> None:
        longest = "é" * 190 + "x"  # 191 characters, 381 bytes in UTF-8
        assert store.put(keyed("first", key=longest))
        assert stored(store, "first").unique_key == longest
        with pytest.raises(DuplicateJobError) as refused:
            store.put(keyed("second", key=longest))
        assert refused.value.existing_id == "first"
        assert holder_of(store, longest) == "first"

    def test_jobs_without_a_key_never_conflict(self, store: IJobStore) -> None:
        for i in range(6):
            status = ACTIVE[i % 2]
            assert store.put(keyed(f"plain-{i}", status, key=None)) is True
        assert store.put(keyed("keyed")) is True
        assert len(store.list()) == 7
        assert [r.id for r in store.list() if r.unique_key is not None] == ["keyed"]

    @pytest.mark.parametrize("write", ["advance", "put"])
    def test_a_row_cannot_be_written_into_a_held_key(self, store: IJobStore, write: str) -> None:
        assert store.put(keyed("holder"))
        assert store.put(keyed("other", key=None))
        other = stored(store, "other")
        with pytest.raises(DuplicateJobError) as refused:
            getattr(store, write)(other.evolve(unique_key=KEY, updated=NOW))
        assert refused.value.existing_id == "holder"
        assert refused.value.unique_key == KEY
        assert stored(store, "other") == other
        assert holder_of(store) == "holder"
        # ...nor started into it.
        with pytest.raises(DuplicateJobError):
            getattr(store, write)(other.evolve(status=Status.IN_PROGRESS, unique_key=KEY))
        assert stored(store, "other") == other

    def test_a_write_refused_for_its_version_does_not_raise(self, store: IJobStore) -> None:
        assert store.put(keyed("holder"))
        assert store.put(keyed("other", key=None))
        other = stored(store, "other")
        stale = other.evolve(unique_key=KEY, version=other.version + 3)
        assert store.put(stale) is False
        assert store.advance(stale) is False
        assert stored(store, "other") == other

    def test_the_holder_never_conflicts_with_itself(self, store: IJobStore) -> None:
        assert store.put(keyed("holder", payload={"workflows": []}))
        claimed = store.claim_step("holder", [0, 0, 0, 0], "me", NOW, LEASE_UNTIL, start=True)
        assert claimed is not None and claimed.status is Status.IN_PROGRESS
        assert claimed.unique_key == KEY
        step = stored(store, "holder").evolve(state={"cursor": [0, 1, 0, 0]}, lease_owner=None)
        assert store.advance(step) is True
        running = stored(store, "holder")
        assert running.unique_key == KEY and running.version == 3
        assert store.put(running.evolve(error="once")) is True  # a put too
        assert holder_of(store) == "holder"
        assert store.advance(stored(store, "holder").evolve(status=Status.COMPLETED)) is True
        done = stored(store, "holder")
        assert (done.status, done.version, done.unique_key) == (Status.COMPLETED, 5, KEY)
        assert holder_of(store) is None

    def test_key_holder(self, store: IJobStore) -> None:
        assert store.key_holder(KEY) is None
        assert store.put(keyed("old", Status.FAILED))
        assert store.key_holder(KEY) is None, "an ended job holds no key"
        assert store.put(keyed("new", payload={"workflows": [{"tasks": []}]}))
        assert store.key_holder(KEY) == stored(store, "new")
        assert store.key_holder("another") is None
        assert store.advance(stored(store, "new").evolve(status=Status.IN_PROGRESS))
        assert store.key_holder(KEY) == stored(store, "new")
        assert store.advance(stored(store, "new").evolve(status=Status.CANCELLED))
        assert store.key_holder(KEY) is None

    def test_racing_jobs_for_one_key_have_one_winner(self, store: IJobStore) -> None:
        barrier = threading.Barrier(RACERS)

        def racer(n: int) -> bool | DuplicateJobError:
            barrier.wait(timeout=30)
            try:
                return store.put(keyed(f"racer-{n}"))
            except DuplicateJobError as exc:
                return exc

        with ThreadPoolExecutor(max_workers=RACERS) as pool:
            results = list(pool.map(racer, range(RACERS)))
        winners = [f"racer-{n}" for n, result in enumerate(results) if result is True]
        assert len(winners) == 1, results
        losers = [r for r in results if isinstance(r, DuplicateJobError)]
        assert len(losers) == RACERS - 1, results
        assert {(e.unique_key, e.existing_id) for e in losers} == {(KEY, winners[0])}
        assert [r.id for r in store.list()] == winners
        assert holder_of(store) == winners[0]


class TestWaits:
    @pytest.fixture(autouse=True)
    def parent(self, store: IJobStore) -> None:
        """The ended parent ``p`` that :data:`WAITS` names: a waiting job is stored
        only while its parents are."""
        assert store.put(job("p", status=Status.COMPLETED))

    def test_a_waiting_job_round_trips_its_waits_since_created(self, store: IJobStore) -> None:
        created = T0 + timedelta(minutes=1, microseconds=250)
        assert store.put(job("child", status=Status.SCHEDULED, waits=WAITS, created=created))
        row = stored(store, "child")
        assert row.waits == WAITS and isinstance(row.waits, dict)
        assert row.waiting_since == created
        assert [r.id for r in store.waiting()] == ["child"]

    def test_an_explicit_waiting_since_round_trips(self, store: IJobStore) -> None:
        since = datetime(2024, 1, 1, 14, 0, 0, 654321, tzinfo=timezone(timedelta(hours=2)))
        assert store.put(job(status=Status.SCHEDULED, waits=WAITS, waiting_since=since))
        row = stored(store)
        assert row.waiting_since == since and row.waiting_since.utcoffset() == timedelta(0)
        assert row.created == T0

    def test_clearing_the_waits_clears_waiting_since(self, store: IJobStore) -> None:
        assert store.put(job("child", status=Status.SCHEDULED, waits=WAITS))
        row = stored(store, "child")
        assert store.advance(row.evolve(waits=None)) is True
        after = stored(store, "child")
        assert (after.waits, after.waiting_since, after.status) == (None, None, Status.SCHEDULED)
        assert store.waiting() == []

    @pytest.mark.parametrize("status", [Status.IN_PROGRESS, *TERMINALS])
    def test_starting_or_ending_clears_waiting_since(
        self, store: IJobStore, status: Status
    ) -> None:
        assert store.put(job("child", status=Status.SCHEDULED, waits=WAITS))
        assert store.advance(stored(store, "child").evolve(status=status)) is True
        after = stored(store, "child")
        assert after.status is status
        assert after.waits == WAITS, "the row keeps what it waited for"
        assert after.waiting_since is None
        assert store.waiting() == []

    def test_waiting_lists_waiting_scheduled_jobs_oldest_first(self, store: IJobStore) -> None:
        minute = timedelta(minutes=1)
        rows: list[tuple[str, Status, dict[str, Any] | None, dict[str, Any]]] = [
            ("w3", Status.SCHEDULED, WAITS, {"created": T0 + 3 * minute}),
            ("w1b", Status.SCHEDULED, WAITS, {"created": T0 + minute}),
            ("w1", Status.SCHEDULED, WAITS, {"created": T0 + minute}),  # tie: id decides
            # waiting_since orders, not created
            ("w2", Status.SCHEDULED, WAITS, {"created": T0, "waiting_since": T0 + 2 * minute}),
            ("plain", Status.SCHEDULED, None, {"created": T0}),
            ("running", Status.IN_PROGRESS, WAITS, {"created": T0}),
            ("done", Status.COMPLETED, WAITS, {"created": T0}),
        ]
        for job_id, status, waits, times in rows:
            assert store.put(job(job_id, status=status, waits=waits, **times))

        def ids(**options: Any) -> list[str]:
            return [r.id for r in store.waiting(**options)]

        assert ids() == ["w1", "w1b", "w2", "w3"]
        assert ids(limit=2) == ["w1", "w1b"]
        assert ids(limit=0) == []
        assert ids(after=(T0 + minute, "w1")) == ["w1b", "w2", "w3"]
        assert ids(after=(T0 + minute, "w1b")) == ["w2", "w3"]
        assert ids(after=(T0 + minute, "a"), limit=1) == ["w1"]
        assert ids(after=(T0 + 3 * minute, "w3")) == []
        assert ids(after=(T0 - minute, "zzz")) == ["w1", "w1b", "w2", "w3"]
        # The same instant in another zone is the same cursor.
        plus_two = timezone(timedelta(hours=2))
        assert ids(after=((T0 + 2 * minute).astimezone(plus_two), "w2")) == ["w3"]
        assert all(r.waits == WAITS for r in store.waiting())

    def test_paging_through_waiting_jobs_yields_each_once(self, store: IJobStore) -> None:
        minutes = {"a": 0, "b": 0, "c": 1, "d": 2, "e": 2, "f": 2, "g": 5}
        for job_id, m in sorted(minutes.items(), reverse=True):
            created = T0 + timedelta(minutes=m)
            assert store.put(job(job_id, status=Status.SCHEDULED, waits=WAITS, created=created))
        assert store.put(job("not-waiting", status=Status.SCHEDULED, created=T0))
        pages: list[list[str]] = []
        cursor: tuple[datetime, str] | None = None
        while page := store.waiting(limit=3, after=cursor):
            pages.append([r.id for r in page])
            last = page[-1]
            assert last.waiting_since is not None
            cursor = (last.waiting_since, last.id)
            assert len(pages) < 10, "paging does not end"
        assert pages == [["a", "b", "c"], ["d", "e", "f"], ["g"]]

    def test_a_waiting_job_is_not_claimed_until_its_waits_are_cleared(
        self, store: IJobStore
    ) -> None:
        assert store.put(
            job(status=Status.SCHEDULED, waits=WAITS, payload={"workflows": [{"tasks": []}]})
        )
        before = stored(store)
        assert store.claim_step("job-1", [0, 0, 0, 0], "me", NOW, LEASE_UNTIL, start=True) is None
        assert stored(store) == before
        assert store.advance(before.evolve(waits=None)) is True
        claimed = store.claim_step("job-1", [0, 0, 0, 0], "me", NOW, LEASE_UNTIL, start=True)
        assert claimed is not None
        assert stored(store) == claimed
        assert (claimed.status, claimed.lease_owner, claimed.version) == (
            Status.IN_PROGRESS,
            "me",
            3,
        )
        assert claimed.payload == {"workflows": [{"tasks": []}]}


class TestGetMany:
    def test_returns_the_stored_ones_among_the_ids(self, store: IJobStore) -> None:
        for job_id in ("a", "b", "c"):
            assert store.put(job(job_id, status=Status.SCHEDULED, state={"n": job_id}))
        found = store.get_many(["c", "zzz", "a", "a", "c"])
        assert sorted(r.id for r in found) == ["a", "c"]
        assert {r.id: r for r in found} == {"a": stored(store, "a"), "c": stored(store, "c")}
        assert store.get_many({"b"}) == [stored(store, "b")]
        assert store.get_many(()) == []
        assert store.get_many(["nope", "nada"]) == []

    def test_many_ids_at_once(self, store: IJobStore) -> None:
        count = 600  # more than one batch of an SQL IN list
        ids = [f"j{i:04d}" for i in range(count)]
        for job_id in ids:
            assert store.put(job(job_id))
        asked = [*ids, *ids[:50], *(f"missing-{i}" for i in range(30))]
        found = store.get_many(asked)
        assert sorted(r.id for r in found) == ids


def schedule(name: str = "nightly", **fields: Any) -> RecurringSchedule:
    fields.setdefault("cron", "*/5 * * * *")
    fields.setdefault("timezone", "Europe/Paris")
    fields.setdefault(
        "template",
        {
            "channel_id": "reports",
            "category": "nightly",
            "payload": {"workflows": [{"tasks": [{"executor_id": "r.run", "args": [1, "é"]}]}]},
        },
    )
    fields.setdefault("next_slot", NOW)
    fields.setdefault("created", T0)
    fields.setdefault("updated", T0)
    return RecurringSchedule(name=name, **fields)


def kept(keeper: IJobStore, name: str = "nightly") -> RecurringSchedule:
    found = keeper.get_recurring(name)
    assert found is not None, f"schedule {name} is not stored"
    return found


class TestRecurringSchedules:
    def test_save_inserts_with_version_1(self, keeper: IJobStore) -> None:
        assert keeper.get_recurring("nightly") is None
        saved = keeper.save_recurring(schedule())
        assert saved == schedule(version=1)
        assert kept(keeper) == saved

    def test_save_replaces_by_name_keeping_created(self, keeper: IJobStore) -> None:
        keeper.save_recurring(schedule())
        replacement = schedule(
            cron="0 3 * * *",
            next_slot=NOW + timedelta(days=1),
            paused=True,
            created=T0 + timedelta(days=7),
            updated=T0 + timedelta(days=7),
        )
        saved = keeper.save_recurring(replacement)
        assert saved == replacement.evolve(version=2, created=T0)
        assert kept(keeper) == saved
        assert [s.name for s in keeper.list_recurring()] == ["nightly"]

    def test_racing_saves_of_one_name_each_replace_it(self, keeper: IJobStore) -> None:
        """Processes that start together each store their schedules: no save is lost."""
        for name in ("first", "second", "third"):  # later rounds race on a warm pool
            barrier = threading.Barrier(RACERS)

            def saver(n: int, name: str = name, barrier: threading.Barrier = barrier) -> Any:
                barrier.wait(timeout=30)
                return keeper.save_recurring(schedule(name, last_job_id=f"saver-{n}"))

            with ThreadPoolExecutor(max_workers=RACERS) as pool:
                saved = list(pool.map(saver, range(RACERS)))
            assert sorted(s.version for s in saved) == list(range(1, RACERS + 1)), name
            assert kept(keeper, name) == max(saved, key=lambda s: s.version)
            assert {s.created for s in saved} == {T0}

    @pytest.mark.parametrize(
        "varied",
        [
            pytest.param(
                {
                    "max_start_delay": 90.125,
                    "overlap": "allow",
                    "catch_up": "all",
                    "last_job_id": "nightly:2024-01-01T13:00",
                    "paused": True,
                },
                id="all-set",
            ),
            pytest.param({"max_start_delay": 0.1, "catch_up": "none"}, id="decimal-delay"),
            pytest.param({}, id="defaults"),
        ],
    )
    def test_get_round_trips_every_field(self, keeper: IJobStore, varied: dict[str, Any]) -> None:
        plus_two = timezone(timedelta(hours=2))
        original = schedule(
            next_slot=datetime(2024, 1, 1, 15, 5, 0, 123456, tzinfo=plus_two),
            last_slot=(
                datetime(2024, 1, 1, 15, 0, 0, 654321, tzinfo=plus_two)
                if "last_job_id" in varied
                else None
            ),
            updated=T0 + timedelta(microseconds=7),
            **varied,
        )
        keeper.save_recurring(original)
        got = kept(keeper)
        assert got == original.evolve(version=1)
        assert got.template == original.template and isinstance(got.template, dict)
        assert type(got.paused) is bool
        for name in ("next_slot", "last_slot", "created", "updated"):
            value = getattr(got, name)
            assert value is None or value.utcoffset() == timedelta(0), name
        assert got.next_slot.microsecond == 123456

    @pytest.mark.parametrize("delay", [86399.875, 1234.5678, 3 * 86400 + 0.001])
    def test_max_start_delay_keeps_every_digit(self, keeper: IJobStore, delay: float) -> None:
        keeper.save_recurring(schedule(max_start_delay=delay))
        assert kept(keeper).max_start_delay == delay

    def test_advance_is_a_compare_and_set_on_version(self, keeper: IJobStore) -> None:
        saved = keeper.save_recurring(schedule())
        later = saved.evolve(
            next_slot=NOW + timedelta(minutes=5),
            last_slot=NOW,
            last_job_id="nightly:1",
            updated=NOW,
            created=NOW,  # never written
        )
        assert keeper.advance_recurring(later.evolve(version=0)) is False
        assert keeper.advance_recurring(later.evolve(version=2)) is False
        assert kept(keeper) == saved
        assert keeper.advance_recurring(later) is True
        assert kept(keeper) == later.evolve(version=2, created=T0)
        assert keeper.advance_recurring(later.evolve(paused=True)) is False, "version 1 is stale"
        assert kept(keeper).paused is False
        assert keeper.advance_recurring(schedule("unknown", version=1)) is False
        assert keeper.get_recurring("unknown") is None

    def test_names_are_compared_exactly(self, keeper: IJobStore) -> None:
        keeper.save_recurring(schedule("nightly"))
        assert keeper.save_recurring(schedule("Nightly")).version == 1
        assert [s.name for s in keeper.list_recurring()] == ["Nightly", "nightly"]
        assert keeper.delete_recurring("NIGHTLY") is False

    def test_list_is_ordered_by_name(self, keeper: IJobStore) -> None:
        assert keeper.list_recurring() == []
        for name in ("charlie", "alpha", "bravo"):
            keeper.save_recurring(schedule(name))
        listed = keeper.list_recurring()
        assert [s.name for s in listed] == ["alpha", "bravo", "charlie"]
        assert listed[0] == kept(keeper, "alpha")

    def test_delete(self, keeper: IJobStore) -> None:
        keeper.save_recurring(schedule("a"))
        keeper.save_recurring(schedule("b"))
        assert keeper.delete_recurring("a") is True
        assert keeper.get_recurring("a") is None
        assert keeper.delete_recurring("a") is False
        assert [s.name for s in keeper.list_recurring()] == ["b"]
        saved = keeper.save_recurring(schedule("a"))
        assert saved.version == 1, "a deleted name starts anew"

    def test_due_lists_unpaused_schedules_whose_slot_came_soonest_first(
        self, keeper: IJobStore
    ) -> None:
        slots = {
            "late": (NOW - timedelta(minutes=5), False),
            "on-time": (NOW, False),
            "not-yet": (NOW + timedelta(seconds=1), False),
            "paused": (NOW - timedelta(minutes=10), True),
            "very-early": (NOW - timedelta(hours=1), False),
        }
        for name, (slot, paused) in slots.items():
            keeper.save_recurring(schedule(name, next_slot=slot, paused=paused))
        due = keeper.due_recurring(NOW)
        assert [s.name for s in due] == ["very-early", "late", "on-time"]
        assert due[0] == kept(keeper, "very-early")
        assert [s.name for s in keeper.due_recurring(NOW, limit=2)] == ["very-early", "late"]
        assert keeper.due_recurring(NOW - timedelta(hours=2)) == []
        plus_two = timezone(timedelta(hours=2))
        assert [s.name for s in keeper.due_recurring(NOW.astimezone(plus_two), limit=1)] == [
            "very-early"
        ]

    def test_a_store_without_schedules_refuses_to_store_one(self) -> None:
        minimal = MinimalStore()
        with pytest.raises(StoreError, match="recurring"):
            minimal.save_recurring(schedule())
