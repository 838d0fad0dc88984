"""The store contract for rows that cannot be read: a column changed by raw SQL.

A single read raises CorruptRecordError naming the row and the column; a listing or
batch read answers a placeholder (``damaged`` set, what could be read) and goes on
with the other rows. Only the SQL stores: the memory store keeps records, not rows,
so nothing can put a value no writer writes into it.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text

from pypepper_dramatiq.errors import CorruptRecordError, CorruptScheduleError, retry_may_cure
from pypepper_dramatiq.records.recurring import RecurringSchedule
from pypepper_dramatiq.records.workers import WorkerInfo
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import StepClaim
from pypepper_dramatiq.stores.sql import SqlJobStore

from .test_store_contract import T0, job

SQL_STORES = [
    pytest.param("pg_store", id="postgres", marks=pytest.mark.postgres),
    pytest.param("mysql_store", id="mysql", marks=pytest.mark.mysql),
]

PAYLOAD = {"workflows": [{"tasks": [{"name": "a", "executor_id": "x"}]}]}


@pytest.fixture(params=SQL_STORES)
def store(request: pytest.FixtureRequest) -> Iterator[SqlJobStore]:
    sql_store: SqlJobStore = request.getfixturevalue(request.param)
    with sql_store.engine.begin() as conn:
        conn.execute(text("DELETE FROM scheduler_workers"))
    yield sql_store


def corrupt(store: SqlJobStore, sql: str, **params: Any) -> None:
    """Run a raw UPDATE, as a person with a SQL prompt would."""
    with store.engine.begin() as conn:
        assert conn.execute(text(sql), params).rowcount == 1


def is_mysql(store: SqlJobStore) -> bool:
    return store.engine.dialect.name in ("mysql", "mariadb")


def json_value(store: SqlJobStore, value: str) -> str:
    """A JSON literal as each dialect's UPDATE takes it."""
    return f"'{value}'" if is_mysql(store) else f"'{value}'::jsonb"


#: (column, SQL value, the words the reason holds).
DAMAGE = [
    ("state", "json:[1,2,3]", "expected an object, found a list"),
    ("state", 'json:{"attempts": [1]}', "key 'attempts': expected an object"),
    ("state", 'json:{"cursor": "x"}', "key 'cursor'"),
    ("state", 'json:{"hooks": {"0.0": 3}}', "key 'hooks'"),
    ("state", 'json:{"hooks": {"0.0": {"until": "soon"}}}', "'until' is null or an ISO time"),
    ("state", 'json:{"history": {"0.0": [1]}}', "expected a list of objects, found a list"),
    ("payload", 'json:"text"', "expected an object or null, found a string"),
    ("payload", 'json:{"workflows": {}}', "key 'workflows': expected a list"),
    ("payload", 'json:{"workflows": [{"tasks": [7]}]}', "task 0.0"),
    ("waits", "json:[1]", "expected an object or null, found a list"),
    ("waits", 'json:{"parents": "p"}', "key 'parents'"),
    ("status", "'Bogus'", "'Bogus', which names none"),
    ("version", "-1", "expected a version of 0 or more"),
]


def damage(store: SqlJobStore, job_id: str, column: str, value: str) -> None:
    sql_value = json_value(store, value[5:]) if value.startswith("json:") else value
    corrupt(store, f"UPDATE scheduler_jobs SET {column} = {sql_value} WHERE id = :id", id=job_id)


def put_pair(store: SqlJobStore, **fields: Any) -> None:
    """A whole row "good" and a row "bad" alike, "bad" created a second later."""
    fields.setdefault("payload", PAYLOAD)
    assert store.put(job("good", **fields))
    assert store.put(job("bad", **dict(fields, created=T0 + timedelta(seconds=1))))


@pytest.mark.parametrize(("column", "value", "words"), DAMAGE)
def test_get_raises_naming_the_job_and_the_column(
    store: SqlJobStore, column: str, value: str, words: str
) -> None:
    put_pair(store, status=Status.SCHEDULED)
    damage(store, "bad", column, value)
    with pytest.raises(CorruptRecordError) as caught:
        store.get("bad")
    assert (caught.value.job_id, caught.value.column) == ("bad", column)
    assert words in caught.value.reason
    assert "job bad: stored row is damaged" in str(caught.value)
    assert not retry_may_cure(caught.value)
    assert store.get("good") is not None and store.get("good").damaged is None  # type: ignore[union-attr]


@pytest.mark.parametrize(("column", "value", "words"), DAMAGE)
def test_listings_answer_a_placeholder_and_the_other_rows(
    store: SqlJobStore, column: str, value: str, words: str
) -> None:
    put_pair(store, status=Status.FAILED, category="etl", error="E: x")
    damage(store, "bad", column, value)
    for found in (store.list(), store.list(newest_first=True), store.get_many(["bad", "good"])):
        by_id = {record.id: record for record in found}
        assert set(by_id) == {"bad", "good"}
        assert by_id["good"].damaged is None and by_id["good"].payload == PAYLOAD
        placeholder = by_id["bad"]
        damaged = placeholder.damaged
        assert damaged is not None
        assert damaged.startswith(f"column {column!r}: ") and words in damaged
        # What could be read is kept; the damaged column is left out.
        assert placeholder.channel_id == "default" and placeholder.category == "etl"
        assert placeholder.created == T0 + timedelta(seconds=1)
        expected = Status.UNKNOWN if column == "status" else Status.FAILED
        assert placeholder.status is expected
    if column != "status":  # a status no version knows is in no status's page
        page = store.list(limit=10, newest_first=True)
        assert [(r.id, r.damaged is not None) for r in page] == [("bad", True), ("good", False)]
        assert [r.id for r in store.list(status=Status.FAILED)] == ["good", "bad"]


def test_the_state_example_of_the_issue_reads_as_the_placeholder_says(
    store: SqlJobStore,
) -> None:
    put_pair(store, status=Status.SCHEDULED)
    damage(store, "bad", "state", "json:[1,2,3]")
    (placeholder,) = store.get_many(["bad"])
    assert placeholder.damaged == "column 'state': expected an object, found a list"
    assert placeholder.state == {} and placeholder.payload == PAYLOAD


@pytest.mark.mysql
def test_a_zero_date_is_named_as_the_column_that_holds_it(mysql_store: SqlJobStore) -> None:
    put_pair(mysql_store, status=Status.COMPLETED)
    corrupt(
        mysql_store,
        "UPDATE scheduler_jobs SET created = '0000-00-00 00:00:00' WHERE id = 'bad'",
    )
    with pytest.raises(CorruptRecordError) as caught:
        mysql_store.get("bad")
    assert caught.value.column == "created" and "expected a time" in caught.value.reason
    placeholder = {r.id: r for r in mysql_store.list()}["bad"]
    assert placeholder.damaged is not None and placeholder.status is Status.COMPLETED


# -- the recovery sweep's batch reads -------------------------------------------------------


NOW = T0 + timedelta(hours=1)


def test_the_sweeps_batch_reads_answer_placeholders(store: SqlJobStore) -> None:
    rows = {
        "waiting": {"status": Status.SCHEDULED, "waits": {"parents": ["p"]}},
        "release": {"status": Status.SCHEDULED, "release_at": T0},
        "overdue": {"status": Status.SCHEDULED, "start_deadline": T0},
        "lapsed": {"status": Status.IN_PROGRESS, "lease_owner": "w", "lease_expires": T0},
    }
    assert store.put(job("p", status=Status.IN_PROGRESS))  # the waiting rows' parent
    for name, fields in rows.items():
        for n, kind in enumerate(("good", "bad")):
            assert store.put(
                job(f"{name}-{kind}", created=T0 + timedelta(seconds=n), payload=PAYLOAD, **fields)
            )
        damage(store, f"{name}-bad", "state", "json:[1,2,3]")
    reads = {
        "waiting": lambda: store.waiting(),
        "release": lambda: store.due_releases(NOW),
        "overdue": lambda: store.overdue(NOW),
        "lapsed": lambda: store.recover_expired(NOW, NOW + timedelta(minutes=1)),
    }
    for name, read in reads.items():
        found = {record.id: record.damaged for record in read()}
        assert set(found) == {f"{name}-good", f"{name}-bad"}, name
        assert found[f"{name}-good"] is None
        assert found[f"{name}-bad"] == "column 'state': expected an object, found a list"
    scheduled = store.list(status=Status.SCHEDULED, limit=100)
    assert sum(record.damaged is not None for record in scheduled) == 3


def test_a_row_left_out_is_logged_once_per_process(
    store: SqlJobStore, caplog: pytest.LogCaptureFixture
) -> None:
    name = f"logged-{uuid.uuid4().hex[:8]}"  # not logged by this process before
    store.save_recurring(schedule(name))
    corrupt(store, f"UPDATE scheduler_recurring SET cron = 'x' WHERE name = '{name}'")
    with caplog.at_level(logging.WARNING, logger="pypepper_dramatiq.stores.rows"):
        for _ in range(3):
            assert name not in [s.name for s in store.due_recurring(NOW)]
    lines = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert lines == [
        f"schedule {name}: stored row is damaged (column 'cron': expected a cron expression "
        "of 5 or 6 fields, found 'x'); left out: it does not fire"
    ]


def test_a_placeholder_is_not_logged_by_the_store(
    store: SqlJobStore, caplog: pytest.LogCaptureFixture
) -> None:
    put_pair(store, status=Status.SCHEDULED)
    damage(store, "bad", "waits", "json:[7]")
    with caplog.at_level(logging.WARNING, logger="pypepper_dramatiq.stores.rows"):
        assert {r.id for r in store.list()} == {"good", "bad"}
    assert not [r for r in caplog.records if "bad" in r.getMessage()]


# -- claims ------------------------------------------------------------------------------


def claim(job_id: str, start: bool = True) -> StepClaim:
    return StepClaim(job_id, [0, 0, 0, 0], "me", NOW, NOW + timedelta(minutes=1), start)


@pytest.mark.parametrize("column", ["state", "payload"])
def test_a_claim_of_a_damaged_row_raises_and_a_batch_answers_it_in_place(
    store: SqlJobStore, column: str
) -> None:
    put_pair(store, status=Status.SCHEDULED)
    damage(store, "bad", column, "json:[1,2,3]")
    with pytest.raises(CorruptRecordError) as caught:
        if store.claim_step("bad", [0, 0, 0, 0], "me", NOW, NOW, start=True) is None:
            store.get("bad")  # the caller's read, to learn why
    assert caught.value.column == column
    assert store.put(job("other", status=Status.SCHEDULED, payload=PAYLOAD))
    good, bad, other = store.claim_steps([claim("good"), claim("bad"), claim("other")])
    assert good is not None and not isinstance(good, Exception) and good.lease_owner == "me"
    assert isinstance(other, type(good)) and other.lease_owner == "me"
    if bad is not None:  # None: not claimed, and the caller's read raises
        assert isinstance(bad, CorruptRecordError) and bad.column == column


def test_a_claim_leaves_a_row_whose_state_is_not_an_object_as_it_is(
    store: SqlJobStore,
) -> None:
    put_pair(store, status=Status.SCHEDULED)
    damage(store, "bad", "state", "json:[1,2,3]")
    store.claim_steps([claim("bad"), claim("good")])
    with contextlib.suppress(CorruptRecordError):
        store.claim_step("bad", [0, 0, 0, 0], "me", NOW, NOW, start=True)
    with store.engine.connect() as conn:
        status, owner = conn.execute(
            text("SELECT status, lease_owner FROM scheduler_jobs WHERE id = 'bad'")
        ).one()
    assert (status, owner) == ("Scheduled", None)


def test_renewing_a_lease_on_a_row_of_unknown_status_answers_unknown(
    store: SqlJobStore,
) -> None:
    assert store.put(job("held", status=Status.IN_PROGRESS, lease_owner="me", lease_expires=NOW))
    damage(store, "held", "status", "'Bogus'")
    assert store.renew_leases("me", ["held"], NOW) == {"held": Status.UNKNOWN}
    counts = store.count_by_status()
    assert sum(counts.values()) == 0


# -- recurring schedules and worker rows -------------------------------------------------


def schedule(name: str) -> RecurringSchedule:
    template = {"channel_id": "default", "category": None, "payload": PAYLOAD}
    return RecurringSchedule(name, "*/5 * * * *", "UTC", template, next_slot=T0)


SCHEDULE_DAMAGE = [
    ("template", "json:[1]", "expected an object"),
    ("template", 'json:{"channel_id": "c", "payload": 3}', "key 'payload'"),
    ("cron", "'every day'", "5 or 6 fields"),
    ("timezone", "'Mars/Olympus'", "expected an IANA time zone"),
    ("overlap", "'maybe'", "expected one of skip, allow"),
]


@pytest.mark.parametrize(("column", "value", "words"), SCHEDULE_DAMAGE)
def test_a_damaged_schedule_raises_alone_is_listed_marked_and_never_fires(
    store: SqlJobStore, column: str, value: str, words: str
) -> None:
    for name in ("good", "bad"):
        store.save_recurring(schedule(name))
    sql_value = json_value(store, value[5:]) if value.startswith("json:") else value
    corrupt(store, f"UPDATE scheduler_recurring SET {column} = {sql_value} WHERE name = 'bad'")
    with pytest.raises(CorruptScheduleError) as caught:
        store.get_recurring("bad")
    assert (caught.value.name, caught.value.column) == ("bad", column)
    assert words in caught.value.reason
    assert str(caught.value).startswith("recurring schedule bad: stored row is damaged")
    listed = {s.name: s for s in store.list_recurring()}
    assert listed["good"].damaged is None
    damaged = listed["bad"].damaged
    assert damaged is not None and damaged.startswith(f"column {column!r}: ")
    if value.startswith("'"):  # text that is not valid is shown as stored
        assert getattr(listed["bad"], column) == value.strip("'")
    assert [s.name for s in store.due_recurring(NOW)] == ["good"]  # it never fires
    with pytest.raises(CorruptScheduleError, match="a placeholder is never written back"):
        store.advance_recurring(listed["bad"].evolve(paused=True))


def test_a_damaged_worker_row_is_left_out_of_the_listing(store: SqlJobStore) -> None:
    for owner in ("w-good", "w-bad"):
        store.beat_worker(WorkerInfo(owner, "host", 1, NOW, NOW, channels=("default",)))
    value = json_value(store, '"default"')
    corrupt(store, f"UPDATE scheduler_workers SET channels = {value} WHERE owner = 'w-bad'")
    assert [w.owner for w in store.workers(NOW)] == ["w-good"]


def test_a_placeholder_is_never_written_back(store: SqlJobStore) -> None:
    put_pair(store, status=Status.SCHEDULED)
    damage(store, "bad", "state", "json:[1,2,3]")
    (placeholder,) = store.get_many(["bad"])
    changed = placeholder.evolve(status=Status.CANCELLED, error="cancelled by the sweep")
    for write in (store.put, store.advance, lambda r: store.advance_many([r])):
        with pytest.raises(CorruptRecordError, match="a placeholder is never written back"):
            write(changed)
    with store.engine.connect() as conn:
        status, state = conn.execute(
            text("SELECT status, state FROM scheduler_jobs WHERE id = 'bad'")
        ).one()
    assert status == "Scheduled" and state in ([1, 2, 3], "[1,2,3]", "[1, 2, 3]")


def test_the_other_batch_reads_answer_placeholders(store: SqlJobStore) -> None:
    hooks = {"hooks": {"0.0": {"status": "pending", "owner": "w", "since": "x", "until": None}}}
    for n, job_id in enumerate(("good", "bad")):
        assert store.put(
            job(
                job_id,
                created=T0 + timedelta(seconds=n),
                status=Status.IN_PROGRESS,
                lease_owner="w",
                payload=PAYLOAD,
                state=hooks,
            )
        )
    damage(store, "bad", "payload", "json:[1]")
    for found in (store.pending_hooks(), store.held_by(["w"])):
        assert sorted((r.id, r.damaged) for r in found) == [
            ("bad", "column 'payload': expected an object or null, found a list"),
            ("good", None),
        ]


def test_a_purge_goes_on_past_a_waiting_row_whose_waits_are_damaged(store: SqlJobStore) -> None:
    assert store.put(job("ended", status=Status.COMPLETED))
    assert store.put(job("other", status=Status.IN_PROGRESS))
    assert store.put(job("child", status=Status.SCHEDULED, waits={"parents": ["other"]}))
    damage(store, "child", "waits", "json:[1]")
    assert store.purge(Status.COMPLETED, NOW, 10) == ["ended"]
