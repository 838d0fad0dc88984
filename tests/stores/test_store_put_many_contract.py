"""The store contract of ``put_many`` (``schedule_many``'s insert), run against each store.

Reuses the stores of :mod:`.test_store_contract` (memory, the abstract defaults of
``IJobStore`` through ``MinimalStore``, PostgreSQL, MariaDB): every answer must be
the one a loop of ``put`` gives, row by row, in the list's order.
"""

from __future__ import annotations

import pytest

from pypepper_dramatiq.errors import DuplicateJobError
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import IJobStore

from .test_store_contract import T0, job, store, stored

__all__ = ["store"]

KEY = "report:2024-01"


def test_an_empty_list_writes_nothing(store: IJobStore) -> None:
    assert store.put_many([]) == []


def test_new_jobs_are_inserted_with_version_1_in_order(store: IJobStore) -> None:
    records = [
        job(f"job-{i}", status=Status.SCHEDULED, category="mail", payload={"n": i})
        for i in range(5)
    ]
    assert store.put_many(records) == [True] * 5
    for record in records:
        assert stored(store, record.id) == record.evolve(version=1)


def test_a_job_stored_already_answers_false_and_the_others_go_in(store: IJobStore) -> None:
    assert store.put(job("job-2", status=Status.IN_PROGRESS, category="first"))
    records = [job(f"job-{i}", status=Status.SCHEDULED, category="new") for i in range(4)]
    assert store.put_many(records) == [True, True, False, True]
    assert stored(store, "job-2").category == "first"  # untouched
    assert stored(store, "job-2").status is Status.IN_PROGRESS
    assert {stored(store, f"job-{i}").category for i in (0, 1, 3)} == {"new"}


def test_an_id_twice_in_the_list_is_inserted_once(store: IJobStore) -> None:
    first = job("job-1", status=Status.SCHEDULED, category="first")
    second = job("job-1", status=Status.SCHEDULED, category="second")
    assert store.put_many([first, job("job-2"), second]) == [True, True, False]
    assert stored(store, "job-1") == first.evolve(version=1)


def test_updates_follow_the_rules_of_put(store: IJobStore) -> None:
    assert store.put(job("job-1", status=Status.SCHEDULED))
    assert store.put(job("job-2", status=Status.SCHEDULED))
    later = T0.replace(minute=5)
    answers = store.put_many(
        [
            job("job-1", status=Status.IN_PROGRESS, version=1, updated=later),  # seen version
            job("job-2", status=Status.IN_PROGRESS, version=7, updated=later),  # stale
            job("job-3", status=Status.SCHEDULED),
        ]
    )
    assert answers == [True, False, True]
    assert stored(store, "job-1").version == 2
    assert stored(store, "job-2").version == 1
    assert stored(store, "job-2").status is Status.SCHEDULED


def test_a_taken_unique_key_raises_after_the_rows_before_it(store: IJobStore) -> None:
    assert store.put(job("holder", status=Status.SCHEDULED, unique_key=KEY))
    records = [
        job("job-1", status=Status.SCHEDULED),
        job("job-2", status=Status.SCHEDULED, unique_key=KEY),
        job("job-3", status=Status.SCHEDULED),
    ]
    with pytest.raises(DuplicateJobError) as raised:
        store.put_many(records)
    assert raised.value.existing_id == "holder"
    assert store.get("job-1") is not None
    assert store.get("job-2") is None
    assert store.get("job-3") is None


def test_a_list_longer_than_one_statement_is_inserted_whole(store: IJobStore) -> None:
    records = [job(f"job-{i:04d}", status=Status.SCHEDULED) for i in range(1_201)]
    assert store.put_many(records) == [True] * len(records)
    assert len(store.get_many([r.id for r in records])) == len(records)
    assert store.put_many(records[-3:]) == [False] * 3
