"""Both drivers' engines on a row changed by raw SQL (PostgreSQL): the claim raises the
typed error (the middleware dead-letters on it), the in-process worker drops the job,
and the row is left as it is for a person to see."""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import pytest
from process_state import clean_process_state
from sqlalchemy import text

from pypepper_dramatiq import Job, Status, Worker, Workflow, manager, workflow_task
from pypepper_dramatiq.channels.messages import StepMessage
from pypepper_dramatiq.engine.step_io import StepIO
from pypepper_dramatiq.errors import CorruptRecordError
from pypepper_dramatiq.records.record import JobRecord
from pypepper_dramatiq.rules.steps import Position
from pypepper_dramatiq.stores.registry import set_job_store
from pypepper_dramatiq.stores.sql import SqlJobStore

pytestmark = pytest.mark.postgres

CHANNEL = "damaged-rows"
ran: list[str] = []


@workflow_task(name="damaged-rows.work")
def work(task: Any, context: Any) -> str:
    ran.append(context.job_id)
    return "done"


def corrupt(store: SqlJobStore, job_id: str, column: str, value: str) -> None:
    with store.engine.begin() as conn:
        sql = f"UPDATE scheduler_jobs SET {column} = '{value}'::jsonb WHERE id = :id"
        assert conn.execute(text(sql), {"id": job_id}).rowcount == 1


def raw(store: SqlJobStore, job_id: str) -> tuple[Any, ...]:
    with store.engine.connect() as conn:
        query = text("SELECT status, state, lease_owner FROM scheduler_jobs WHERE id = :id")
        return tuple(conn.execute(query, {"id": job_id}).one())


@pytest.mark.parametrize(("column", "value"), [("state", "[1,2,3]"), ("payload", '"text"')])
def test_a_claim_of_a_damaged_row_raises_the_typed_error(
    pg_store: SqlJobStore, column: str, value: str
) -> None:
    tasks = [{"name": "a", "executor_id": "x", "params": {}}]
    record = JobRecord(
        id=uuid.uuid4().hex, status=Status.SCHEDULED, payload={"workflows": [{"tasks": tasks}]}
    )
    assert pg_store.put(record)
    corrupt(pg_store, record.id, column, value)
    book = StepIO(lambda: pg_store, "worker-a", 30.0)
    with pytest.raises(CorruptRecordError) as caught:
        book.claim(StepMessage(record.id, Position(), None))
    assert (caught.value.job_id, caught.value.column) == (record.id, column)


def test_the_inprocess_worker_drops_a_job_whose_row_cannot_be_read(
    pg_store: SqlJobStore, caplog: pytest.LogCaptureFixture
) -> None:
    with clean_process_state():
        set_job_store(pg_store)
        manager.new(CHANNEL)
        job = Job(channel_id=CHANNEL)
        job.workflows.append(Workflow([work.task(name="work")]))
        job_id = job.scheduled()
        corrupt(pg_store, job_id, "state", "[1,2,3]")
        with caplog.at_level(logging.ERROR):
            asyncio.run(Worker(manager.available(CHANNEL)).run_once())
        assert job_id not in ran
        assert raw(pg_store, job_id) == ("Scheduled", [1, 2, 3], None)
        assert any(
            f"job {job_id}: not run, its stored row cannot be read" in r.getMessage()
            for r in caplog.records
        )
