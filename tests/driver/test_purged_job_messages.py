"""A job's first step message that comes back after retention purged the job (known bug).

Found by the chaos test (issue 22, ``PYPEPPER_CHAOS_SEED=404``): a worker is
SIGKILLed while it runs a job's first step; recovery sends the step again and
another worker completes the job; retention then deletes the row; later the
killed worker's unacknowledged copy of the first message comes back (Dramatiq
requeues a dead worker's messages). Its claim finds no row and heals one from
the record the message carries, as for a job whose producer could not store it
(the store was down): the whole job runs again, although its tasks had
finished. The ledger cannot tell the two cases apart from the message alone.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from pypepper_dramatiq import IJobStore, JobRecord, Status
from pypepper_dramatiq.channels.messages import StepMessage
from pypepper_dramatiq.engine.ledger import Outcome, StepBook, StepSkipped
from pypepper_dramatiq.rules.steps import Position
from pypepper_dramatiq.stores.base import utcnow
from pypepper_dramatiq.stores.memory import MemoryJobStore


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest) -> IJobStore:
    if request.param == "memory":
        return MemoryJobStore()
    pg: IJobStore = request.getfixturevalue("pg_store")
    return pg


@pytest.mark.xfail(
    strict=True,
    reason="known bug: a purged job's stale first message heals its row and reruns it",
)
def test_the_first_message_of_a_purged_job_does_not_run_it_again(store: IJobStore) -> None:
    record = JobRecord(
        id=uuid.uuid4().hex,
        channel_id="steps",
        status=Status.SCHEDULED,
        payload={"workflows": [{"tasks": [{"name": "a", "executor_id": "x", "params": {}}]}]},
    )
    assert store.put(record)
    first = StepMessage(record.id, Position(), record)  # as its producer sent it
    book = StepBook(lambda: store, "worker-b", 30.0)
    book.record(book.claim(first), Outcome(True, 7))
    ended = store.get(record.id)
    assert ended is not None and ended.status is Status.COMPLETED
    assert store.purge(Status.COMPLETED, utcnow() + timedelta(seconds=1), 10) == [record.id]

    # The killed worker's copy of the same message comes back.
    with pytest.raises(StepSkipped):
        StepBook(lambda: store, "worker-c", 30.0).claim(first)
    assert store.get(record.id) is None
