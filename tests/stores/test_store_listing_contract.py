"""The store contract of what the dashboard reads: list filters, bounded counts, links.

Reuses the stores of :mod:`.test_store_contract`: memory, the defaults of
``IJobStore`` through ``MinimalStore``, PostgreSQL and MariaDB.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from pypepper_dramatiq.records.links import AFTER, RETRY, RETRY_OF_KEY, Link
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.rules.waits import Waits
from pypepper_dramatiq.stores.base import IJobStore, JobFilter, JobRecord

from .test_store_contract import T0, job, store, stored

__all__ = ["store"]  # the fixture: every store of the contract


def put(store: IJobStore, job_id: str, status: Status = Status.COMPLETED, **fields: Any) -> None:
    assert store.put(job(job_id, status=status, **fields))


def ids(rows: Any) -> list[str]:
    return [row.id for row in rows]


def at(seconds: int) -> Any:
    return T0 + timedelta(seconds=seconds)


# -- filters -----------------------------------------------------------------------------


def test_created_between_keeps_the_start_and_drops_the_end(store: IJobStore) -> None:
    for n in range(5):
        put(store, f"j{n}", created=at(n))
    found = store.list(created_from=at(1), created_until=at(3))
    assert ids(found) == ["j1", "j2"]
    assert ids(store.list(created_from=at(3), newest_first=True)) == ["j4", "j3"]
    assert ids(store.list(created_until=at(1))) == ["j0"]


def test_search_finds_text_in_the_id_or_the_category_ignoring_case(store: IJobStore) -> None:
    put(store, "Invoice-2024-17", category="billing")
    put(store, "report-1", category="Monthly-INVOICES", created=at(1))
    put(store, "other", category=None, created=at(2))
    assert ids(store.list(search="invoice")) == ["Invoice-2024-17", "report-1"]
    assert ids(store.list(search="BILL")) == ["Invoice-2024-17"]
    assert ids(store.list(search="zzz")) == []


def test_search_finds_text_in_the_error_too(store: IJobStore) -> None:
    put(store, "j-1", status=Status.FAILED, error="ValueError: Disk FULL on /var")
    put(store, "j-2", status=Status.FAILED, error="KeyError: 'x'", created=at(1))
    put(store, "j-3", created=at(2))
    assert ids(store.list(search="disk full")) == ["j-1"]
    assert ids(store.list(search="error", status=Status.FAILED, newest_first=True)) == [
        "j-2",
        "j-1",
    ]
    assert ids(store.list(search="nothing like it")) == []


def test_list_keys_are_the_keys_of_the_listing_from_an_offset(store: IJobStore) -> None:
    for n in range(6):
        put(store, f"k{n}", status=Status.FAILED if n % 2 else Status.COMPLETED, created=at(n))
    listed = [(row.created, row.id) for row in store.list(newest_first=True)]
    assert store.list_keys(offset=0, limit=6, newest_first=True) == listed
    assert store.list_keys(offset=2, limit=2, newest_first=True) == listed[2:4]
    assert store.list_keys(offset=5, limit=2, newest_first=True) == listed[5:]
    assert store.list_keys(offset=6, limit=2, newest_first=True) == []
    assert store.list_keys(offset=1, limit=9) == [(at(n), f"k{n}") for n in range(1, 6)]
    failed = store.list_keys(JobFilter(status=Status.FAILED), offset=0, limit=9, newest_first=True)
    assert [job_id for _, job_id in failed] == ["k5", "k3", "k1"]
    before = store.list_keys(JobFilter(before=listed[1]), offset=0, limit=2, newest_first=True)
    assert before == listed[2:4]
    assert all(created.tzinfo is not None for created, _ in listed)


@pytest.mark.parametrize(
    "text", ["%", "_", "!", "' OR '1'='1", '"; DROP TABLE scheduler_jobs; --', "\\", "%_!'\""]
)
def test_search_takes_sql_metacharacters_as_plain_text(store: IJobStore, text: str) -> None:
    put(store, "plain-job", category="etl")
    put(store, "odd%_!job", category="x", created=at(1))
    found = ids(store.list(search=text))
    assert found == (["odd%_!job"] if text in "odd%_!job" else [])
    assert stored(store, "plain-job").status is Status.COMPLETED  # nothing was dropped


def test_filters_combine_with_the_status_and_the_cursor(store: IJobStore) -> None:
    for n in range(6):
        put(
            store,
            f"etl-{n}",
            status=Status.FAILED if n % 2 else Status.COMPLETED,
            category="etl",
            created=at(n),
        )
    put(store, "web-9", status=Status.FAILED, category="web", created=at(9))
    first = store.list(status=Status.FAILED, search="etl", newest_first=True, limit=2)
    assert ids(first) == ["etl-5", "etl-3"]
    cursor = (first[-1].created, first[-1].id)
    rest = store.list(status=Status.FAILED, search="etl", newest_first=True, limit=2, before=cursor)
    assert ids(rest) == ["etl-1"]
    assert ids(store.list(category="etl", created_from=at(4), newest_first=True)) == [
        "etl-5",
        "etl-4",
    ]


def test_a_page_without_a_status_is_newest_first_across_statuses(store: IJobStore) -> None:
    statuses = list(Status)
    for n in range(21):
        put(store, f"j{n:02}", status=statuses[n % len(statuses)], created=at(n // 2))
    everything = ids(store.list(newest_first=True))
    pages: list[str] = []
    cursor = None
    while True:
        page = store.list(newest_first=True, limit=4, before=cursor)
        if not page:
            break
        pages += ids(page)
        cursor = (page[-1].created, page[-1].id)
    assert pages == everything
    assert everything == sorted(everything, key=lambda i: (at(int(i[1:]) // 2), i), reverse=True)
    assert ids(store.list(limit=3)) == ["j00", "j01", "j02"]


# -- bounded counts ----------------------------------------------------------------------


def test_counts_are_exact_up_to_the_limit_and_say_more_above_it(store: IJobStore) -> None:
    for n in range(7):
        put(store, f"done-{n}", created=at(n))
    for n in range(2):
        put(store, f"failed-{n}", status=Status.FAILED, created=at(n))
    exact = store.count_by_status()
    assert exact[Status.COMPLETED] == 7 and exact[Status.FAILED] == 2
    assert exact[Status.SCHEDULED] == 0 and set(exact) == set(Status)
    bounded = store.count_by_status(limit=5)
    assert bounded[Status.COMPLETED] == 6  # more than 5
    assert bounded[Status.FAILED] == 2
    assert store.count_by_status(limit=7)[Status.COMPLETED] == 7
    between = store.count_by_status(JobFilter(created_from=at(1), created_until=at(4)))
    assert between[Status.COMPLETED] == 3 and between[Status.FAILED] == 1


# -- links -------------------------------------------------------------------------------


def test_links_name_parents_and_children_both_ways(store: IJobStore) -> None:
    put(store, "first", status=Status.COMPLETED)
    put(store, "second", status=Status.FAILED, created=at(1))
    waits = Waits(parents=("first", "second"), on_parent_failure="ignore").to_dict()
    put(store, "fan-in", status=Status.SCHEDULED, waits=waits, created=at(2))
    put(
        store,
        "second-again",
        status=Status.SCHEDULED,
        created=at(3),
        payload={RETRY_OF_KEY: "second", "workflows": []},
    )
    assert store.links("fan-in") == [
        Link("first", "fan-in", AFTER),
        Link("second", "fan-in", AFTER),
    ]
    assert store.links("second") == [
        Link("second", "fan-in", AFTER),
        Link("second", "second-again", RETRY),
    ]
    assert store.links("second-again") == [Link("second", "second-again", RETRY)]
    assert store.links("first") == [Link("first", "fan-in", AFTER)]
    assert store.links("second", limit=1) == [Link("second", "fan-in", AFTER)]
    assert store.links("nobody") == []


def test_links_survive_later_writes_and_go_with_the_child(store: IJobStore) -> None:
    put(store, "parent", status=Status.COMPLETED)
    waits = Waits(parents=("parent",)).to_dict()
    child = JobRecord(id="child", status=Status.SCHEDULED, created=T0, updated=T0, waits=waits)
    assert store.put(child)
    assert store.put(stored(store, "child").evolve(status=Status.IN_PROGRESS))
    assert store.put(stored(store, "child").evolve(status=Status.COMPLETED))
    assert store.links("parent") == [Link("parent", "child", AFTER)]
    assert store.delete("child")
    assert store.links("parent") == []


def test_ended_counts_count_the_ends_of_each_bucket_by_status(store: IJobStore) -> None:
    ends = [
        (0, Status.COMPLETED),
        (59, Status.COMPLETED),
        (61, Status.FAILED),
        (150, Status.CANCELLED),
    ]
    for n, (second, status) in enumerate(ends):
        put(store, f"e{n}", status=status, created=at(0), updated=at(second))
    put(store, "running", status=Status.IN_PROGRESS, created=at(0), updated=at(10))
    put(store, "before", status=Status.COMPLETED, created=at(-100), updated=at(-1))
    put(store, "after", status=Status.FAILED, created=at(0), updated=at(180))
    counts = store.ended_counts(at(0), at(180), 60)
    assert counts == {
        (Status.COMPLETED, 0): 2,
        (Status.FAILED, 1): 1,
        (Status.CANCELLED, 2): 1,
    }


def test_retries_of_names_the_retries_of_each_job_oldest_first(store: IJobStore) -> None:
    put(store, "orig-a", status=Status.FAILED)
    put(store, "orig-b", status=Status.FAILED, created=at(1))
    put(store, "plain", status=Status.FAILED, created=at(2))
    for n, (child, parent) in enumerate([("a-2", "orig-a"), ("a-1", "orig-a"), ("b-1", "orig-b")]):
        put(store, child, created=at(10 - n), payload={"workflows": [], RETRY_OF_KEY: parent})
    put(store, "after-a", created=at(20), waits=Waits(parents=("orig-a",)).to_dict())
    found = store.retries_of(["orig-a", "orig-b", "plain", "nope"])
    assert found == {"orig-a": ["a-1", "a-2"], "orig-b": ["b-1"]}  # a-1 was created first
    assert store.retries_of(["orig-a"], limit=1) == {"orig-a": ["a-1"]}
    assert store.retries_of([]) == {}
