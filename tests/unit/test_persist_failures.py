"""The seed's persist-failure rules, one test per rule, on the in-process driver."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from pypepper_dramatiq import (
    CallableExecutor,
    InvalidTransitionError,
    Job,
    JobRedeliveryError,
    JobRequeuedError,
    Status,
    Task,
    Worker,
    Workflow,
    manager,
    set_job_store,
)
from pypepper_dramatiq.rules.events import INIT, SCHEDULE
from pypepper_dramatiq.stores.base import JobRecord

from .scripted_store import ScriptedStore


@pytest.fixture
def store() -> ScriptedStore:
    scripted = ScriptedStore()
    set_job_store(scripted)
    return scripted


def make_job(calls: list[str], channel: str = "c", fn: Callable[..., Any] | None = None) -> Job:
    def work(task: Task, context: Any) -> str:
        calls.append(task.name)
        return task.name

    job = Job(category="t", channel_id=channel)
    job.workflows.append(
        Workflow([Task(channel, "d", "f", "step", "t", "", [], CallableExecutor(fn or work))])
    )
    return job


def run_once(channel: str = "c") -> Job | None:
    return asyncio.run(Worker(manager.available(channel)).run_once())


# -- Schedule -----------------------------------------------------------------------------


def test_invalid_schedule_transition_rolls_back_and_writes_nothing(store: ScriptedStore) -> None:
    job = make_job([])
    job.scheduled()
    store.puts.clear()
    with pytest.raises(InvalidTransitionError):
        job.scheduled()  # INIT from Scheduled is not allowed
    assert job.status is Status.SCHEDULED
    assert store.puts == []
    assert manager.available("c").length() == 1


# -- Enqueue ------------------------------------------------------------------------------


def test_save_after_send_is_retried_including_a_false_skip(store: ScriptedStore) -> None:
    store.fail(Status.SCHEDULED, times=1, how="false")
    store.fail(Status.SCHEDULED, times=1, how="raise")
    job = make_job([])
    job.scheduled()
    assert store.written() == [Status.SCHEDULED]
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status == "Scheduled"


def test_failed_save_after_send_does_not_roll_back(store: ScriptedStore) -> None:
    store.fail(Status.SCHEDULED, times=3)
    calls: list[str] = []
    job = make_job(calls)
    job.scheduled()  # no exception: the job is queued
    assert job.status is Status.SCHEDULED
    assert Job.get_saved(job.id) is None
    assert manager.available("c").length() == 1
    # The worker heals the missing Scheduled row before RUN, then runs it.
    assert run_once() is job
    assert calls == ["step"]
    assert store.written() == [Status.SCHEDULED, Status.IN_PROGRESS, Status.COMPLETED]


# -- Start (RUN) ---------------------------------------------------------------------------


def test_missing_row_is_healed_as_scheduled_before_run(store: ScriptedStore) -> None:
    calls: list[str] = []
    job = make_job(calls)
    store.fail(Status.SCHEDULED, times=3)
    job.scheduled()
    store.puts.clear()
    run_once()
    assert store.written()[:2] == [Status.SCHEDULED, Status.IN_PROGRESS]


def test_run_snapshot_failure_prefers_persisting_failed(store: ScriptedStore) -> None:
    calls: list[str] = []
    job = make_job(calls)
    job.scheduled()
    store.fail(Status.IN_PROGRESS, times=1)
    assert run_once() is job
    assert calls == []  # no work without a persisted RUN
    assert job.status is Status.FAILED
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status is Status.FAILED
    assert saved.error is not None and "RUN snapshot" in saved.error
    assert manager.available("c").length() == 0


def test_heal_failure_follows_the_run_failure_path(store: ScriptedStore) -> None:
    calls: list[str] = []
    job = make_job(calls)
    store.fail(Status.SCHEDULED, times=4)  # three for scheduled(), one for the heal
    job.scheduled()
    run_once()
    assert calls == []
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status is Status.FAILED


@pytest.mark.parametrize("durable", [Status.CANCELLED, Status.IN_PROGRESS, Status.COMPLETED])
def test_run_put_false_follows_the_durable_row(store: ScriptedStore, durable: Status) -> None:
    calls: list[str] = []
    job = make_job(calls)
    job.scheduled()

    def another_writer_moves_first(record: JobRecord) -> None:
        if record.status is Status.IN_PROGRESS and store.before_put is not None:
            store.before_put = None
            current = store.get(job.id)
            assert current is not None
            if durable is Status.COMPLETED:
                assert store.put(current.evolve(status=Status.IN_PROGRESS))
                current = store.get(job.id)
                assert current is not None
            assert store.put(current.evolve(status=durable))

    store.before_put = another_writer_moves_first
    run_once()
    assert calls == []
    assert job.status is durable
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status is durable


@pytest.mark.parametrize("row_deleted", [False, True], ids=["row-unmoved", "row-deleted"])
def test_run_put_false_with_nothing_to_follow_prefers_failed(
    store: ScriptedStore, row_deleted: bool
) -> None:
    # The RUN write is refused but nobody moved the row on (or it is gone): nothing to follow.
    calls: list[str] = []
    job = make_job(calls)
    job.scheduled()

    def row_deleted_meanwhile(record: JobRecord) -> None:
        if record.status is Status.IN_PROGRESS:
            store.before_put = None
            assert store.delete(job.id)

    store.fail(Status.IN_PROGRESS, times=1, how="false")
    if row_deleted:
        store.before_put = row_deleted_meanwhile
    assert run_once() is job
    assert calls == []
    assert job.status is Status.FAILED
    if not row_deleted:
        saved = Job.get_saved(job.id)
        assert saved is not None and saved.status is Status.FAILED


def test_a_scheduled_row_rewritten_by_another_writer_still_runs(store: ScriptedStore) -> None:
    # Its version moved on (a heal, a producer's retried write) but it is still Scheduled.
    calls: list[str] = []
    job = make_job(calls)
    job.scheduled()
    current = store.get(job.id)
    assert current is not None
    assert store.put(current.evolve(state={"rewritten": True}))
    assert run_once() is job
    assert calls == ["step"]
    assert job.status is Status.COMPLETED
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status is Status.COMPLETED


def test_durable_in_progress_at_dequeue_is_not_run_again(store: ScriptedStore) -> None:
    calls: list[str] = []
    job = make_job(calls)
    job.scheduled()
    current = store.get(job.id)
    assert current is not None
    assert store.put(current.evolve(status=Status.IN_PROGRESS))
    run_once()
    assert calls == []
    assert job.status is Status.IN_PROGRESS


def test_unpersistable_run_restores_and_requeues(store: ScriptedStore) -> None:
    calls: list[str] = []
    job = make_job(calls)
    job.scheduled()
    store.fail(Status.IN_PROGRESS, times=1)
    store.fail(Status.FAILED, times=3)
    with pytest.raises(JobRequeuedError) as raised:
        run_once()
    assert raised.value.job is job
    assert calls == []
    assert job.status is Status.SCHEDULED  # pre-RUN restored
    assert job.error is None  # the failure it could not store is not carried along
    assert manager.available("c").length() == 1  # back on the channel
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status is Status.SCHEDULED
    # The store is back: the next pass runs it.
    assert run_once() is job
    assert calls == ["step"]
    assert job.status is Status.COMPLETED


def test_run_forever_reraises_requeued_at_once(store: ScriptedStore) -> None:
    calls: list[str] = []
    first, second = make_job(calls), make_job(calls)
    first.scheduled()
    second.scheduled()
    store.fail(Status.IN_PROGRESS, times=1)
    store.fail(Status.FAILED, times=3)
    worker = Worker(manager.available("c"))
    with pytest.raises(JobRequeuedError):
        asyncio.run(worker.run_forever())
    assert calls == []  # it stopped at once instead of going on to the second job
    assert manager.available("c").length() == 2


def test_requeue_into_a_full_channel_fails_the_job_and_stops(store: ScriptedStore) -> None:
    calls: list[str] = []
    manager.new("c", maxsize=1)
    job = make_job(calls)
    job.scheduled()
    filler = make_job(calls)

    def fill_channel_when_run_fails(record: JobRecord) -> None:
        if record.status is Status.FAILED and record.id == job.id and not filler.status.rank:
            # Another producer takes the freed slot before the worker can put the job back.
            filler.apply_event(INIT)
            filler.apply_event(SCHEDULE)
            assert manager.available("c").offer(filler) == "ok"

    store.fail(Status.IN_PROGRESS, times=1)
    store.fail(Status.FAILED, times=3)
    store.before_put = fill_channel_when_run_fails
    worker = Worker(manager.available("c"))
    with pytest.raises(JobRedeliveryError) as raised:
        asyncio.run(worker.run_forever())
    assert raised.value.reason == "full"
    assert raised.value.job is job
    assert job.status is Status.FAILED
    assert calls == []  # stopped immediately: the filler was not run
    assert manager.available("c").length() == 1
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status is Status.FAILED
    assert saved.error is not None and "full" in saved.error


def test_requeue_into_a_stopped_channel_drains_then_raises(store: ScriptedStore) -> None:
    calls: list[str] = []
    job, later = make_job(calls), make_job(calls)
    job.scheduled()
    later.scheduled()
    channel = manager.available("c")
    channel.request_stop()
    store.fail(Status.IN_PROGRESS, times=1)
    store.fail(Status.FAILED, times=3)
    with pytest.raises(JobRedeliveryError) as raised:
        asyncio.run(Worker(channel).run_forever())
    assert raised.value.reason == "stopped"
    assert raised.value.job is job
    assert job.status is Status.FAILED
    assert later.status is Status.COMPLETED  # the leftover was drained first
    assert calls == ["step"]


def test_a_winning_cancel_is_not_overwritten_by_restore(store: ScriptedStore) -> None:
    calls: list[str] = []
    job = make_job(calls)
    job.scheduled()

    def cancel_while_run_write_fails(record: JobRecord) -> None:
        if record.status is Status.IN_PROGRESS and store.before_put is not None:
            store.before_put = None
            job.cancel()  # its own write fails too (scripted below)

    store.fail(Status.IN_PROGRESS, times=1)
    store.fail(Status.CANCELLED, times=3)
    store.before_put = cancel_while_run_write_fails
    run_once()
    assert calls == []
    assert job.status is Status.CANCELLED
    assert manager.available("c").length() == 0  # not re-enqueued
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status is Status.CANCELLED  # the worker retried the write


# -- After work ------------------------------------------------------------------------------


def test_failed_terminal_write_is_retried_without_rerunning(store: ScriptedStore) -> None:
    calls: list[str] = []
    job = make_job(calls)
    job.scheduled()
    store.fail(Status.COMPLETED, times=2)
    run_once()
    assert calls == ["step"]
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status is Status.COMPLETED


def test_lost_terminal_write_keeps_the_fsm_and_does_not_rerun(store: ScriptedStore) -> None:
    calls: list[str] = []
    job = make_job(calls)
    job.scheduled()
    store.fail(Status.COMPLETED, times=10)
    run_once()
    assert calls == ["step"]
    assert job.status is Status.COMPLETED
    assert job.to_record().status is Status.COMPLETED  # the FSM leads the store
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status is Status.IN_PROGRESS


# -- Cancel ------------------------------------------------------------------------------------


def test_cancel_keeps_cancelled_and_retries_the_write(store: ScriptedStore) -> None:
    job = make_job([])
    job.scheduled()
    store.fail(Status.CANCELLED, times=2)
    assert job.cancel() is True
    assert job.status is Status.CANCELLED
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status is Status.CANCELLED


def test_worker_skips_a_cancelled_job_and_heals_a_lagging_store(store: ScriptedStore) -> None:
    calls: list[str] = []
    job = make_job(calls)
    job.scheduled()
    store.fail(Status.CANCELLED, times=3)
    assert job.cancel() is False  # the store lags
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status is Status.SCHEDULED
    run_once()
    assert calls == []
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status is Status.CANCELLED


def test_worker_never_applies_cancel_itself(store: ScriptedStore) -> None:
    calls: list[str] = []
    job = make_job(calls)
    job.scheduled()
    job.cancel()
    run_once()
    assert store.written().count(Status.CANCELLED) == 1  # only cancel() wrote it


def test_store_down_when_reading_before_run_requeues(store: ScriptedStore) -> None:
    calls: list[str] = []
    job = make_job(calls)
    job.scheduled()
    store.gets_fail = 1
    store.fail(Status.FAILED, times=3)
    with pytest.raises(JobRequeuedError):
        run_once()
    assert calls == []
    assert manager.available("c").length() == 1


def test_rescheduling_a_finished_job_is_refused(store: ScriptedStore) -> None:
    from pypepper_dramatiq import executor_registry

    executor_registry.register("step-fn", lambda task, context: "done")
    job = Job(category="t", channel_id="c")
    job.workflows.append(
        Workflow([Task("c", "d", "f", "step", "t", "", [], None, executor_id="step-fn")])
    )
    job.scheduled()
    run_once()
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status is Status.COMPLETED
    rebuilt = Job.from_record(saved)
    with pytest.raises(InvalidTransitionError, match="Completed"):
        rebuilt.scheduled()
    assert rebuilt.status is Status.UNKNOWN
    assert manager.available("c").length() == 0


def test_persist_adopts_a_row_that_already_holds_its_status(store: ScriptedStore) -> None:
    # A worker healed the row (Scheduled, version 1) before the producer's own write.
    job = make_job([])
    healed = job.to_record().evolve(
        status=Status.SCHEDULED, state={"healed": True}, updated=job.updated + timedelta(seconds=5)
    )
    assert store.put(healed)
    job.apply_event(INIT)
    job.apply_event(SCHEDULE)
    store.puts.clear()
    assert job.persist() is True
    assert store.written() == []  # adopted, not rewritten: the worker's version stands
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.version == 1 and job.version == 1
    assert (job.updated, job.state) == (healed.updated, {"healed": True})
