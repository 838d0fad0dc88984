"""A producer whose Scheduled write comes after a worker already healed and moved its job on."""

from __future__ import annotations

import logging

import pytest

from pypepper_dramatiq import CallableExecutor, Job, Status, Task, Workflow, set_job_store
from pypepper_dramatiq.stores.base import JobRecord, utcnow
from pypepper_dramatiq.stores.memory import MemoryJobStore


class WorkerWinsTheRace(MemoryJobStore):
    """Before the producer's first Scheduled write lands, a 'worker' heals the row
    from the message and moves it to ``then`` (as a fast Dramatiq worker does)."""

    def __init__(self, then: Status) -> None:
        super().__init__()
        self.then = then
        self.raced = False

    def put(self, record: JobRecord) -> bool:
        if not self.raced and record.status is Status.SCHEDULED:
            self.raced = True
            assert super().put(record.evolve(version=0))  # the worker's heal
            healed = self.get(record.id)
            assert healed is not None
            assert super().put(healed.evolve(status=self.then, updated=utcnow()))
        return super().put(record)


def _job() -> Job:
    job = Job(category="race", channel_id="race")
    job.workflows.append(
        Workflow(
            [
                Task("race", "d", "f", "t", None, "", [], CallableExecutor(lambda t, c: 1)),
            ]
        )
    )
    return job


@pytest.mark.parametrize("then", [Status.IN_PROGRESS, Status.COMPLETED, Status.CANCELLED])
def test_a_row_that_moved_on_is_a_persisted_schedule_not_a_warning(
    then: Status, caplog: pytest.LogCaptureFixture
) -> None:
    store = WorkerWinsTheRace(then)
    set_job_store(store)
    job = _job()

    with caplog.at_level(logging.DEBUG, logger="pypepper_dramatiq"):
        job.scheduled()

    assert store.raced
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    row = store.get(job.id)
    assert row is not None and row.status is then  # nothing rewritten over the worker's row
    assert job.version == row.version
