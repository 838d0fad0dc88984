"""The store contract of ``ended_since``: the ended rows of one status by end time.

Run against each store of :mod:`.test_store_contract` (memory, the ``IJobStore``
default through ``MinimalStore``, PostgreSQL, MariaDB): the recovery sweep reads
recent ends with it to count those no process counted.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from pypepper_dramatiq.records.state import mark_counted
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import IJobStore

from .test_store_contract import T0, job, store

__all__ = ["store"]  # the fixture: every store of the contract


def _seed(store: IJobStore) -> None:
    rows = {
        # id: (status, seconds after T0 it was last updated)
        "c-late": (Status.CANCELLED, 30),
        "a-early": (Status.CANCELLED, 10),
        "b-tie": (Status.CANCELLED, 20),
        "a-tie": (Status.CANCELLED, 20),
        "done": (Status.COMPLETED, 15),
        "running": (Status.IN_PROGRESS, 15),
        "old": (Status.CANCELLED, -60),
    }
    for job_id, (status, seconds) in rows.items():
        updated = T0 + timedelta(seconds=seconds)
        assert store.put(
            job(job_id, status=status, created=T0 - timedelta(hours=1), updated=updated)
        )


def test_ended_since_reads_one_status_after_the_watermark_by_update_time(
    store: IJobStore,
) -> None:
    _seed(store)

    found = store.ended_since(Status.CANCELLED, (T0, ""))

    assert [r.id for r in found] == ["a-early", "a-tie", "b-tie", "c-late"]
    assert found[0].updated == T0 + timedelta(seconds=10)
    assert [r.id for r in store.ended_since(Status.COMPLETED, (T0, ""))] == ["done"]


def test_ended_since_pages_by_update_time_then_id(store: IJobStore) -> None:
    _seed(store)

    first = store.ended_since(Status.CANCELLED, (T0, ""), limit=2)
    assert [r.id for r in first] == ["a-early", "a-tie"]
    # Strictly after the last row read: its twin of the same instant comes next.
    rest = store.ended_since(Status.CANCELLED, (first[-1].updated, first[-1].id), limit=2)
    assert [r.id for r in rest] == ["b-tie", "c-late"]
    assert store.ended_since(Status.CANCELLED, (rest[-1].updated, rest[-1].id)) == []


def test_ended_since_hands_back_the_state_so_the_caller_can_skip_counted_ends(
    store: IJobStore,
) -> None:
    assert store.put(job("counted", status=Status.CANCELLED, state=mark_counted({})))
    assert store.put(job("uncounted", status=Status.CANCELLED, state={"results": {}}))

    found = store.ended_since(Status.CANCELLED, (T0 - timedelta(seconds=1), ""))

    assert {r.id: r.state.get("counted") is True for r in found} == {
        "counted": True,
        "uncounted": False,
    }


@pytest.mark.parametrize("status", [Status.SCHEDULED, Status.IN_PROGRESS])
def test_ended_since_refuses_a_status_that_is_not_an_end(store: IJobStore, status: Status) -> None:
    with pytest.raises(ValueError, match="final status"):
        store.ended_since(status, (T0, ""))
