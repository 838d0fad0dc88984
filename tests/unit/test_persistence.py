"""Snapshots, OCC versions, rebuilding jobs from records, executors and cancel."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from pypepper_dramatiq import (
    CANCEL_EVENT_KEY,
    CallableExecutor,
    Context,
    IExecutor,
    InvalidTransitionError,
    Job,
    Status,
    Task,
    UnknownExecutorError,
    UnknownJobError,
    Worker,
    Workflow,
    executor_registry,
    get_job_store,
    manager,
    set_job_store,
)
from pypepper_dramatiq.model.job import CANCEL_ATTEMPTS
from pypepper_dramatiq.records.state import CANCELLED_BY_KEY
from pypepper_dramatiq.rules.events import INIT, RUN, SCHEDULE
from pypepper_dramatiq.stores.base import JobRecord, utcnow
from pypepper_dramatiq.stores.memory import MemoryJobStore

ROOT = Path(__file__).resolve().parents[2]


def callable_task(name: str, func: Any, channel_id: str = "p") -> Task:
    return Task(channel_id, "dag", f"fp-{name}", name, "test", "", [], CallableExecutor(func))


def registered_task(name: str, executor_id: str, channel_id: str = "p", **kw: Any) -> Task:
    return Task(
        channel_id,
        "dag",
        f"fp-{name}",
        name,
        "test",
        "",
        ["x"],
        None,
        executor_id=executor_id,
        **kw,
    )


def job_with(*tasks: Task, channel_id: str = "p") -> Job:
    job = Job(category="test", channel_id=channel_id)
    job.workflows.append(Workflow(tasks))
    return job


def run_worker_once(channel_id: str = "p") -> Job | None:
    return asyncio.run(Worker(manager.available(channel_id)).run_once())


# -- save / versions --------------------------------------------------------------------------


def test_save_inserts_then_updates_one_row_and_bumps_version() -> None:
    job = job_with(callable_task("t", lambda task, context: 1))
    assert job.version == 0
    assert job.save() is True
    assert job.version == 1
    first = Job.get_saved(job.id)
    assert first is not None
    assert (first.status, first.version, first.channel_id, first.category) == (
        Status.UNKNOWN,
        1,
        "p",
        "test",
    )
    job.apply_event(INIT)
    assert job.save() is True
    assert job.version == 2
    second = Job.get_saved(job.id)
    assert second is not None
    assert (second.status, second.version) == (Status.INITIALIZING, 2)
    assert second.created == first.created
    assert len(get_job_store().list()) == 1


def test_save_advances_updated_only_on_success() -> None:
    job = job_with()
    before = job.updated
    assert job.save()
    assert job.updated >= before
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.updated == job.updated


def test_a_skipped_save_does_not_rewind_status_updated_or_version() -> None:
    job = job_with()
    job.apply_event(INIT)
    job.apply_event(SCHEDULE)
    assert job.save()
    # Another writer wins the row (a stale version for us).
    other = Job.get_saved(job.id)
    assert other is not None
    assert get_job_store().put(other.evolve(state={"by": "other"}))

    job.apply_event(RUN)
    version, updated = job.version, job.updated
    assert job.save() is False
    assert job.status is Status.IN_PROGRESS
    assert job.version == version
    assert job.updated == updated
    durable = Job.get_saved(job.id)
    assert durable is not None
    assert durable.status is Status.SCHEDULED
    assert durable.version == 2
    assert durable.state == {"by": "other"}
    # to_record reports the FSM status, ahead of the durable one.
    assert job.to_record().status is Status.IN_PROGRESS


def test_a_lifecycle_rewind_is_skipped_and_leaves_the_job_alone() -> None:
    job = job_with()
    job.apply_event(INIT)
    job.apply_event(SCHEDULE)
    assert job.save()
    durable = Job.get_saved(job.id)
    assert durable is not None
    # Someone else moved the row to Cancelled.
    assert get_job_store().put(durable.evolve(status=Status.CANCELLED))
    stale = Job.get_saved(job.id)
    assert stale is not None
    job.version = stale.version  # even with a matching version, Scheduled cannot overwrite
    assert job.save() is False
    assert job.status is Status.SCHEDULED
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status is Status.CANCELLED


def test_to_record_is_the_fsm_snapshot() -> None:
    job = job_with()
    job.apply_event(INIT)
    record = job.to_record()
    assert record.id == job.id
    assert record.status is Status.INITIALIZING
    assert record.version == job.version
    assert Job.get_saved(job.id) is None  # to_record does not write


# -- payloads and from_record -----------------------------------------------------------------


def test_to_record_has_no_payload_with_callable_executors() -> None:
    job = job_with(callable_task("a", lambda task, context: 1))
    assert job.to_record().payload is None


def test_to_record_has_no_payload_unless_every_task_has_an_executor_id() -> None:
    executor_registry.register("tests.p.echo", lambda task, context: task.name)
    job = job_with(registered_task("a", "tests.p.echo"), callable_task("b", lambda t, c: 1))
    assert job.to_record().payload is None


def test_to_record_has_a_json_payload_when_every_task_has_an_executor_id() -> None:
    executor_registry.register("tests.p.echo", lambda task, context: task.name)
    job = job_with(
        registered_task("a", "tests.p.echo", retry_count=2, params={"n": 1}),
        registered_task("b", "tests.p.echo"),
    )
    job.workflows.append(Workflow([registered_task("c", "tests.p.echo")]))
    payload = job.to_record().payload
    assert payload is not None
    assert json.loads(json.dumps(payload)) == payload
    names = [[t["name"] for t in w["tasks"]] for w in payload["workflows"]]
    assert names == [["a", "b"], ["c"]]
    assert payload["workflows"][0]["tasks"][0]["retry_count"] == 2
    assert payload["workflows"][0]["tasks"][0]["params"] == {"n": 1}


def test_from_record_rebuilds_a_runnable_job_at_unknown() -> None:
    calls: list[tuple[str, dict[str, Any]]] = []

    def work(task: Task, context: Context) -> Any:
        calls.append((task.name, dict(task.params)))
        return task.params.get("n", 0) * 10

    executor_registry.register("tests.p.work", work)
    original = job_with(
        registered_task("first", "tests.p.work", params={"n": 1}, retry_count=1),
        registered_task("second", "tests.p.work", params={"n": 2}),
    )
    original.scheduled()
    record = Job.get_saved(original.id)
    assert record is not None and record.status is Status.SCHEDULED

    rebuilt = Job.from_record(record)
    assert rebuilt.id == original.id
    assert rebuilt.status is Status.UNKNOWN
    assert [t.name for t in rebuilt.workflows[0].get_tasks()] == ["first", "second"]
    assert rebuilt.workflows[0].get_tasks()[0].retry_count == 1
    assert rebuilt is not original

    # A fresh process would have neither the original job nor its queue entry.
    manager.clear()
    rebuilt.scheduled()
    assert run_worker_once() is rebuilt
    assert rebuilt.status is Status.COMPLETED
    assert calls == [("first", {"n": 1}), ("second", {"n": 2})]
    saved = Job.get_saved(rebuilt.id)
    assert saved is not None and saved.status == "Completed"


def test_from_record_keeps_times_progress_and_error() -> None:
    executor_registry.register("tests.p.work2", lambda task, context: None)
    original = job_with(registered_task("only", "tests.p.work2"))
    original.scheduled()
    stored = Job.get_saved(original.id)
    assert stored is not None
    progress = {"cursor": [0, 0, 0, 1], "results": {"0.0": 7}}
    record = stored.evolve(state=progress, error="boom")

    rebuilt = Job.from_record(record)
    assert rebuilt.version == record.version
    assert rebuilt.created == record.created
    assert rebuilt.updated == record.updated
    assert rebuilt.state == progress and rebuilt.state is not record.state
    assert rebuilt.error == "boom"


def test_a_task_survives_its_json_form_field_by_field() -> None:
    executor_registry.register("tests.p.rt", lambda task, context: None)
    original = Task(
        "etl",
        "dag-7",
        "fp-9",
        "load",
        "cat",
        "loads rows",
        ["a", "b"],
        None,
        retry_count=2,
        retry_delay=1.5,
        retry_until_completed=True,
        retry_until_max=9,
        round_times=3,
        round_timeout=4.0,
        round_timeout_join=0.5,
        optional=True,
        executor_id="tests.p.rt",
        params={"rows": [1, 2]},
    )
    rebuilt = Task.from_dict(json.loads(json.dumps(original.to_dict())))
    fields = (
        "channel_id",
        "dag_id",
        "fingerprint",
        "name",
        "category",
        "description",
        "tags",
        "executor_id",
        "params",
        "retry_count",
        "retry_delay",
        "retry_until_completed",
        "retry_until_max",
        "round_times",
        "round_timeout",
        "round_timeout_join",
        "optional",
    )
    assert {f: getattr(rebuilt, f) for f in fields} == {f: getattr(original, f) for f in fields}
    assert rebuilt.tags == ["a", "b"] and rebuilt.optional is True


def test_a_record_normalises_status_and_times_to_utc() -> None:
    plus_two = timezone(timedelta(hours=2))
    record = JobRecord(
        id="r",
        channel_id="c",
        category=None,
        status="Scheduled",  # type: ignore[arg-type]
        version=1,
        created=datetime(2024, 1, 1, 12, 0, tzinfo=plus_two),
        updated=datetime(2024, 1, 1, 13, 0),  # naive: taken as UTC
        lease_expires=datetime(2024, 1, 1, 14, 0, tzinfo=plus_two),
    )
    assert record.status is Status.SCHEDULED
    assert record.created == datetime(2024, 1, 1, 10, 0, tzinfo=timezone.utc)
    assert record.created.tzinfo is timezone.utc
    assert record.updated == datetime(2024, 1, 1, 13, 0, tzinfo=timezone.utc)
    assert record.lease_expires is not None and record.lease_expires.tzinfo is timezone.utc
    assert record.lease_expires.hour == 12


def test_an_executor_id_unknown_in_process_fails_the_task_without_retries() -> None:
    result = Workflow(
        [registered_task("ghost", "tests.p.never-registered", retry_count=3, round_times=2)]
    ).run()
    assert not result.ok
    assert result.outcomes[0].attempts == 1
    assert result.error is not None and "tests.p.never-registered" in result.error

    job = job_with(registered_task("ghost", "tests.p.never-registered", retry_count=3))
    job.scheduled()
    assert run_worker_once() is job
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status is Status.FAILED
    assert saved.error is not None and "UnknownExecutorError" in saved.error


def test_a_job_queued_by_another_process_is_rebuilt_from_its_message() -> None:
    calls: list[str] = []
    executor_registry.register("tests.p.rebuilt", lambda task, context: calls.append(task.name))
    original = job_with(registered_task("only", "tests.p.rebuilt"))
    original.scheduled()
    manager.clear()  # this process never held the Job object: only the message is left

    ran = run_worker_once()
    assert ran is not None and ran is not original and ran.id == original.id
    assert ran.status is Status.COMPLETED and calls == ["only"]
    saved = Job.get_saved(original.id)
    assert saved is not None and saved.status is Status.COMPLETED


def test_a_queued_job_this_process_cannot_rebuild_is_failed_not_left_scheduled() -> None:
    executor_registry.register("tests.p.elsewhere", lambda task, context: None)
    job = job_with(registered_task("only", "tests.p.elsewhere"))
    job.scheduled()
    manager.clear()
    executor_registry.unregister("tests.p.elsewhere")  # a worker without that code

    channel = manager.available("p")
    channel.request_stop()  # run_once returns once the queue is empty
    assert asyncio.run(Worker(channel).run_once()) is None
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status is Status.FAILED
    assert saved.error is not None and "tests.p.elsewhere" in saved.error


def test_from_record_with_an_unknown_executor_id_raises_value_error() -> None:
    executor_registry.register("tests.p.gone", lambda task, context: None)
    record = job_with(registered_task("a", "tests.p.gone")).to_record()
    executor_registry.unregister("tests.p.gone")
    with pytest.raises(ValueError) as info:
        Job.from_record(record)
    assert isinstance(info.value, UnknownExecutorError)
    assert "tests.p.gone" in str(info.value)


def test_from_record_without_executor_ids_raises_value_error() -> None:
    job = job_with(callable_task("a", lambda task, context: 1))
    assert job.save()
    record = Job.get_saved(job.id)
    assert record is not None
    with pytest.raises(ValueError) as info:
        Job.from_record(record)
    assert isinstance(info.value, UnknownExecutorError)


# -- executors --------------------------------------------------------------------------------


class Doubler(IExecutor):
    def execute(self, task: Task, context: Context) -> Any:
        return task.params["n"] * 2


def test_registry_accepts_a_function_or_an_executor() -> None:
    def fn(task: Task, context: Context) -> Any:
        return "fn"

    wrapped = executor_registry.register("tests.p.fn", fn)
    assert isinstance(wrapped, CallableExecutor)
    assert executor_registry.get("tests.p.fn") is wrapped
    instance = Doubler()
    assert executor_registry.register("tests.p.obj", instance) is instance
    assert executor_registry.get("tests.p.obj") is instance
    assert {"tests.p.fn", "tests.p.obj"} <= set(executor_registry.ids())
    assert "tests.p.obj" in executor_registry

    job = job_with(
        registered_task("f", "tests.p.fn"), registered_task("d", "tests.p.obj", params={"n": 21})
    )
    job.share_cancel_event()
    result = job.workflows[0].run()
    assert result.results == {"f": "fn", "d": 42}


def test_registry_get_of_an_unknown_id_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        executor_registry.get("tests.p.never")


def test_callable_executor_calls_func_with_task_and_its_context() -> None:
    seen: dict[str, Any] = {}

    def fn(task: Task, context: Context) -> Any:
        seen["task"], seen["context"] = task, context
        return "r"

    task = callable_task("t", fn)
    job = job_with(task)
    job.share_cancel_event()
    assert job.workflows[0].run().ok
    assert seen["task"] is task
    assert seen["context"] is task.context
    event = seen["context"].context[CANCEL_EVENT_KEY]
    assert isinstance(event, threading.Event)
    assert event is job.context.context[CANCEL_EVENT_KEY]


def test_callable_executor_does_not_wrap_errors() -> None:
    def fn(task: Task, context: Context) -> Any:
        raise KeyError("raw")

    executor = CallableExecutor(fn)
    with pytest.raises(KeyError):
        executor.execute(callable_task("t", fn), Context())


def test_callable_executor_needs_a_callable() -> None:
    with pytest.raises(TypeError):
        CallableExecutor("not callable")  # type: ignore[arg-type]


def test_executor_sees_cancel_after_job_cancel() -> None:
    observed: list[bool] = []
    started, proceed = threading.Event(), threading.Event()

    def fn(task: Task, context: Context) -> Any:
        started.set()
        proceed.wait(5)
        observed.append(context.context[CANCEL_EVENT_KEY].is_set())

    job = job_with(callable_task("t", fn))
    job.scheduled()

    async def go() -> None:
        worker = asyncio.create_task(Worker(manager.available("p")).run_once())
        assert await asyncio.to_thread(started.wait, 5)
        job.cancel()
        proceed.set()
        await asyncio.wait_for(worker, 5)

    asyncio.run(go())
    assert observed == [True]
    assert job.status is Status.CANCELLED
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status == "Cancelled"


def test_executor_sees_its_job_id_in_the_context() -> None:
    seen: list[str | None] = []
    job = job_with(callable_task("t", lambda task, context: seen.append(context.job_id)))
    job.scheduled()
    assert run_worker_once() is job
    assert seen == [job.id]


# -- cancel -----------------------------------------------------------------------------------


def test_cancel_applies_cancel_sets_the_event_and_persists() -> None:
    job = job_with(callable_task("t", lambda task, context: 1))
    job.scheduled()
    event = job.context.context[CANCEL_EVENT_KEY]
    assert isinstance(event, threading.Event) and not event.is_set()
    assert job.cancel() is True
    assert job.status is Status.CANCELLED
    assert event.is_set()
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status == "Cancelled"


def test_cancel_from_in_progress_persists_cancelled() -> None:
    job = job_with()
    job.scheduled()
    job.apply_event(RUN)
    assert job.save()
    assert job.cancel()
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status == "Cancelled"


def test_cancel_persists_over_a_newer_scheduled_row() -> None:
    job = job_with()
    job.scheduled()
    durable = Job.get_saved(job.id)
    assert durable is not None
    assert get_job_store().put(durable.evolve(state={"touched": True}))  # another writer
    assert job.cancel() is True
    saved = Job.get_saved(job.id)
    assert saved is not None
    assert saved.status == "Cancelled"
    assert job.version == saved.version


def test_cancel_keeps_the_progress_a_worker_stored() -> None:
    job = job_with()
    job.scheduled()
    durable = Job.get_saved(job.id)
    assert durable is not None
    progress = {"cursor": [0, 1, 0, 0], "results": {"0.0": "done"}}
    # A worker elsewhere started the job and finished its first task.
    assert get_job_store().put(durable.evolve(status=Status.IN_PROGRESS, state=progress))
    assert job.cancel() is True
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status is Status.CANCELLED
    by = saved.state.pop(CANCELLED_BY_KEY)  # written again over the adopted progress
    assert saved.state == progress
    assert by["by"] == "api" and by["host"] == socket.gethostname()


def test_is_cancelled_follows_the_shared_event_alone() -> None:
    job = job_with()
    job.scheduled()
    assert not job.is_cancelled
    job.context.context[CANCEL_EVENT_KEY].set()  # whoever shares the event cancels
    assert job.status is Status.SCHEDULED
    assert job.is_cancelled


def test_adopting_a_cancelled_row_takes_its_version_and_sets_the_event() -> None:
    job = job_with()
    job.scheduled()
    durable = Job.get_saved(job.id)
    assert durable is not None
    later = durable.updated + timedelta(seconds=5)  # written elsewhere, later
    assert get_job_store().put(durable.evolve(status=Status.CANCELLED, updated=later))
    stored = Job.get_saved(job.id)
    assert stored is not None

    job.adopt(stored)
    assert job.status is Status.CANCELLED
    assert (job.version, job.updated) == (stored.version, stored.updated)
    assert job.context.context[CANCEL_EVENT_KEY].is_set()


def test_adopting_a_running_row_leaves_the_event_clear() -> None:
    job = job_with()
    job.scheduled()
    durable = Job.get_saved(job.id)
    assert durable is not None
    assert get_job_store().put(durable.evolve(status=Status.IN_PROGRESS))
    stored = Job.get_saved(job.id)
    assert stored is not None
    job.adopt(stored)
    assert job.status is Status.IN_PROGRESS and job.version == stored.version
    assert not job.context.context[CANCEL_EVENT_KEY].is_set()


def test_worker_skips_a_cancelled_job() -> None:
    calls: list[str] = []
    job = job_with(callable_task("t", lambda task, context: calls.append(task.name)))
    job.scheduled()
    job.cancel()
    assert run_worker_once() is job
    assert calls == []
    assert job.status is Status.CANCELLED
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status == "Cancelled"


def test_cancel_of_an_unknown_job_raises_and_changes_nothing() -> None:
    job = job_with()
    with pytest.raises(InvalidTransitionError):
        job.cancel()
    assert job.status is Status.UNKNOWN
    assert not job.cancel_event.is_set()
    assert Job.get_saved(job.id) is None


def test_cancel_of_a_completed_job_raises_and_keeps_completed() -> None:
    job = job_with(callable_task("t", lambda task, context: 1))
    job.scheduled()
    run_worker_once()
    assert job.status is Status.COMPLETED
    with pytest.raises(InvalidTransitionError):
        job.cancel()
    assert job.status is Status.COMPLETED
    assert not job.cancel_event.is_set()
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status == "Completed"


# -- cancel by id -----------------------------------------------------------------------------


def test_cancel_saved_cancels_a_stored_job_without_its_code_and_keeps_progress() -> None:
    job = job_with()
    job.scheduled()
    durable = Job.get_saved(job.id)
    assert durable is not None
    progress = {"cursor": [0, 1, 0, 0], "results": {"0.0": 1}}
    assert get_job_store().put(durable.evolve(status=Status.IN_PROGRESS, state=progress))

    assert Job.cancel_saved(job.id) is True
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status is Status.CANCELLED
    kept = {k: v for k, v in saved.state.items() if k != CANCELLED_BY_KEY}
    assert kept == progress and saved.payload == durable.payload
    assert saved.version == durable.version + 2
    by = saved.state[CANCELLED_BY_KEY]
    assert by["by"] == "api" and by["host"] == socket.gethostname()
    assert datetime.fromisoformat(by["at"]) == saved.updated


def test_cancel_saved_records_who_cancelled() -> None:
    job = job_with()
    job.scheduled()
    assert Job.cancel_saved(job.id, by="ops-script") is True
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.state[CANCELLED_BY_KEY]["by"] == "ops-script"


def test_job_cancel_records_who_cancelled() -> None:
    job = job_with()
    job.scheduled()
    assert job.cancel(by="billing") is True
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status is Status.CANCELLED
    assert saved.state[CANCELLED_BY_KEY]["by"] == "billing"
    assert saved.state[CANCELLED_BY_KEY]["host"] == socket.gethostname()


def test_cancel_saved_of_a_cancelled_job_raises_as_for_any_end_and_writes_nothing() -> None:
    job = job_with()
    job.scheduled()
    assert Job.cancel_saved(job.id) is True
    first = Job.get_saved(job.id)
    with pytest.raises(InvalidTransitionError, match="Cancelled") as raised:
        Job.cancel_saved(job.id)
    assert raised.value.status == "Cancelled"
    assert Job.get_saved(job.id) == first


def test_cancel_saved_of_an_unknown_id_is_a_lookup_error() -> None:
    with pytest.raises(UnknownJobError, match="no-such-job") as raised:
        Job.cancel_saved("no-such-job")
    assert isinstance(raised.value, LookupError) and raised.value.job_id == "no-such-job"


@pytest.mark.parametrize("terminal", [Status.COMPLETED, Status.FAILED])
def test_cancel_saved_of_a_finished_job_raises_and_keeps_it(terminal: Status) -> None:
    job = job_with()
    job.scheduled()
    durable = Job.get_saved(job.id)
    assert durable is not None
    assert get_job_store().put(durable.evolve(status=terminal))
    with pytest.raises(InvalidTransitionError, match=terminal.value):
        Job.cancel_saved(job.id)
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status is terminal


def test_a_job_cancelled_elsewhere_while_it_ran_ends_cancelled_here(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def cancelled_by_another_process(task: Task, context: Context) -> str:
        # Another process's cancel_saved: only the row changes, nobody tells us.
        row = get_job_store().get(context.job_id or "")
        assert row is not None
        assert get_job_store().put(row.evolve(status=Status.CANCELLED))
        return "done"

    job = job_with(callable_task("t", cancelled_by_another_process))
    job.scheduled()
    assert run_worker_once() is job
    assert job.status is Status.CANCELLED  # followed the row, not Completed
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status is Status.CANCELLED
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


class MovingStore(MemoryJobStore):
    """Another writer bumps the row right before each of the first ``moves`` advances."""

    def __init__(self, moves: int) -> None:
        super().__init__()
        self.moves = moves

    def advance(self, record: JobRecord) -> bool:
        if self.moves > 0:
            self.moves -= 1
            current = self.get(record.id)
            assert current is not None and self.put(current.evolve(updated=utcnow()))
        return super().advance(record)


@pytest.mark.parametrize(
    ("moves", "cancelled", "ends"),
    [(3, True, Status.CANCELLED), (10_000, False, Status.SCHEDULED)],
    ids=["retries-then-wins", "gives-up-when-the-row-never-holds-still"],
)
def test_cancel_saved_while_workers_move_the_row(moves: int, cancelled: bool, ends: Status) -> None:
    store = MovingStore(moves=moves)
    set_job_store(store)
    job = job_with()
    job.scheduled()
    assert Job.cancel_saved(job.id) is cancelled
    saved = store.get(job.id)
    assert saved is not None and saved.status is ends
    assert store.moves == moves - min(moves, CANCEL_ATTEMPTS)  # one try per move, bounded


# -- the example ------------------------------------------------------------------------------


def test_minimal_example_shows_what_happened_where_and_what_next() -> None:
    started = time.monotonic()
    completed = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "minimal.py")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    took = time.monotonic() - started
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert re.fullmatch(
        r"job [0-9a-f]{32}: Completed \(channel 'demo', run in this process\)", lines[0]
    )
    assert lines[1:3] == [
        "  task extract: returned {'rows': [1, 2, 3]}",
        "  task total: returned 6",
    ]
    shown = completed.stdout
    assert "memory (MemoryJobStore)" in shown  # where the state lives
    assert 'configure_job_store("postgres"' in shown  # how to switch
    assert "dramatiq worker processes" in shown and "pypepper-dramatiq dashboard" in shown
    assert len(lines) <= 12  # a few readable lines
    sections = re.findall(r'README\.md, "([^"]+)"', shown)
    readme = (ROOT / "README.md").read_text()
    assert sections and all(f"\n## {name}\n" in readme for name in sections), sections
    pages = re.findall(r"docs/[\w/-]+\.md", shown)
    assert all((ROOT / page).is_file() for page in pages), pages
    assert took < 30, took  # seconds, not minutes (a hang bound, not a speed check)


def test_a_task_without_a_channel_of_its_own_is_stored_on_its_jobs_channel() -> None:
    from pypepper_dramatiq import actor_task, workflow_task

    @workflow_task(name="tests.p.channel_echo")
    def echo(task: Task, context: Context) -> str:
        return task.name

    @dramatiq.actor(actor_name="tests_p_channel_actor", broker=StubBroker())
    def plain() -> None:
        return None

    try:
        job = Job(category="test", channel_id="etl")
        job.workflows.append(
            Workflow(
                [
                    echo.task(name="inherits"),
                    echo.task(name="own", channel_id="other"),
                    actor_task(plain, name="actor"),
                ]
            )
        )
        assert job.save()
        stored = get_job_store().get(job.id)
        assert stored is not None and stored.payload is not None
        tasks = stored.payload["workflows"][0]["tasks"]
        channels = {t["name"]: t["channel_id"] for t in tasks}
        assert channels == {"inherits": "etl", "own": "other", "actor": "etl"}
        rebuilt = Job.from_record(stored)  # rebuilt, each task keeps the channel stored
        assert [t.channel_id for t in rebuilt.workflows[0].get_tasks()] == ["etl", "other", "etl"]
    finally:
        executor_registry.unregister("tests.p.channel_echo")
        executor_registry.unregister("actor:tests_p_channel_actor")
