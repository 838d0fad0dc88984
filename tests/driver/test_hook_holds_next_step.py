"""While an optional task's ``on_final_failure`` hook runs, its worker holds the next step.

The write that records the final failure (``StepIO.record_outcome``) claims
the job's next step for the recording worker, under a lease of
``lease_seconds`` that the hook's renewer keeps renewing, instead of the
``delay + dispatch_seconds`` expiry of a step whose message is on its way: a
worker that dies in the hook leaves a row whose lease lapses within a lease,
and the recovery sweep sends the step (``tests/integration/test_hooks_kill.py``
kills real workers there). After the hook, the step is released for its
message, or kept to run in the same thread when the caller continues; a job
cancelled meanwhile gets neither. The in-process driver holds its steps
without an expiry, hook or not.

The hook blocks on an event, so that each test looks at the row while it runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from pypepper_dramatiq import (
    Context,
    Job,
    JobRecord,
    Status,
    Task,
    get_job_store,
    set_job_store,
    workflow_task,
)
from pypepper_dramatiq.engine import step_io
from pypepper_dramatiq.records.record import utcnow
from pypepper_dramatiq.rules.steps import Position, Step
from pypepper_dramatiq.stores.memory import MemoryJobStore

from .drivers import JOB_TIMEOUT, make_job

OWNER = "worker-1"
#: Short, so that the hook's renewer renews the step's lease within the test.
LEASE_SECONDS = 0.6
DISPATCH_SECONDS = 60.0


class BlockingHook:
    """The hook's signals: ``started`` once called, then it waits for ``release``."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.calls = 0

    def __call__(self, task: Task, context: Context, error: str) -> None:
        self.calls += 1
        self.started.set()
        assert self.release.wait(JOB_TIMEOUT), "the test never released the hook"


HOOK = BlockingHook()


def blocking_hook(task: Task, context: Context, error: str) -> None:
    HOOK(task, context, error)


@workflow_task(name="hook-holds.fail", on_final_failure=blocking_hook)
def fail(task: Task, context: Context) -> None:
    raise RuntimeError("planned failure")


@workflow_task(name="hook-holds.next")
def next_task(task: Task, context: Context) -> str:
    return "done"


@pytest.fixture(autouse=True)
def hook() -> Iterator[BlockingHook]:
    global HOOK
    HOOK = BlockingHook()
    set_job_store(MemoryJobStore())
    yield HOOK
    HOOK.release.set()


def claimed_first_step(job: Job, owner: str = OWNER) -> step_io.Claim:
    """The job's first step, claimed by ``owner`` as a worker's claim writes it."""
    job.scheduled()
    store = get_job_store()
    record = store.get(job.id)
    assert record is not None
    now = utcnow()
    tasks = [[task.spec().to_dict() for task in w.get_tasks()] for w in job.workflows]
    started = record.evolve(
        status=Status.IN_PROGRESS,
        state={**record.state, "cursor": [0, 0, 0, 0]},
        lease_owner=owner,
        lease_expires=now + timedelta(seconds=LEASE_SECONDS),
        updated=now,
    )
    assert store.advance(started)
    return step_io.Claim(started.evolve(version=started.version + 1), Position(), tasks)


def optional_failure_then_next() -> Job:
    return make_job([fail.options(optional=True).task(name="opt"), next_task.task(name="next")])


def final_failure() -> step_io.Outcome:
    return step_io.Outcome.failure(RuntimeError("planned failure"), retriable=False)


def book(*, holds_steps: bool = False) -> step_io.StepIO:
    return step_io.StepIO(
        get_job_store,
        OWNER,
        LEASE_SECONDS,
        dispatch_seconds=DISPATCH_SECONDS,
        holds_steps=holds_steps,
    )


class Recording(threading.Thread):
    """``record_outcome`` of the claim on a thread of its own (it blocks in the hook)."""

    def __init__(self, run: Callable[[], step_io.Recorded | None]) -> None:
        super().__init__(daemon=True)
        self._run = run
        self.recorded: step_io.Recorded | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.recorded = self._run()
        except BaseException as exc:
            self.error = exc

    def result(self) -> step_io.Recorded | None:
        self.join(JOB_TIMEOUT)
        assert not self.is_alive(), "record_outcome never returned"
        if self.error is not None:
            raise self.error
        return self.recorded


def failed_in_the_hook(
    hook: BlockingHook,
    record: Callable[[step_io.Claim], step_io.Recorded | None] | None = None,
) -> tuple[Job, step_io.Claim, Recording]:
    """A job whose first step (the claim) failed for good, its outcome being recorded (by
    ``record``; by default a plain book's ``record_outcome``) on a thread of its own, now
    blocked in the hook."""
    job = optional_failure_then_next()
    claim = claimed_first_step(job)
    if record is None:
        recording = Recording(lambda: book().record_outcome(claim, final_failure()))
    else:
        recording = Recording(lambda: record(claim))
    recording.start()
    assert hook.started.wait(JOB_TIMEOUT)
    return job, claim, recording


def row(job_id: str) -> JobRecord:
    record = get_job_store().get(job_id)
    assert record is not None
    return record


def wait_for(predicate: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + JOB_TIMEOUT
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)
    return value


def expiry(record: JobRecord) -> datetime:
    assert record.lease_expires is not None
    return record.lease_expires


def test_while_the_hook_runs_the_next_step_is_held_under_a_renewed_lease(
    hook: BlockingHook,
) -> None:
    job, _, recording = failed_in_the_hook(hook)

    held = row(job.id)
    assert held.status is Status.IN_PROGRESS
    assert held.state["cursor"] == [0, 1, 0, 0]  # the failure is recorded, the step next
    assert held.state["hooks"]["0.0"]["owner"] == OWNER
    assert held.lease_owner == OWNER  # held as a claimed step...
    # ...for a lease, not for dispatch_seconds: a worker dying now leaves it to
    # recovery after LEASE_SECONDS.
    assert expiry(held) <= utcnow() + timedelta(seconds=LEASE_SECONDS)
    # Renewed while the hook runs (it runs longer than a lease here).
    wait_for(lambda: expiry(row(job.id)) > expiry(held), "the step's lease to be renewed")
    wait_for(
        lambda: utcnow() > expiry(held) + timedelta(seconds=LEASE_SECONDS),
        "a lease to pass since the first expiry",
    )
    renewed = row(job.id)
    assert renewed.lease_owner == OWNER and expiry(renewed) > utcnow()  # never lapsed

    hook.release.set()
    recorded = recording.result()

    assert recorded is not None and recorded.decision.position == Position(0, 1)
    released = row(job.id)
    # Released for the caller's message, with the expiry a sent message's step has.
    assert released.lease_owner is None
    assert expiry(released) > utcnow() + timedelta(seconds=DISPATCH_SECONDS - 10)
    assert recorded.record.lease_owner is None
    assert recorded.record.version == released.version
    assert "hooks" not in released.state and "0.0" in released.state["hooks_done"]
    assert hook.calls == 1


def test_after_the_hook_the_caller_may_keep_the_step_to_run_it_here(
    hook: BlockingHook,
) -> None:
    asked: list[tuple[Step, int]] = []

    def hold_next(step: Step) -> bool:
        asked.append((step, hook.calls if hook.release.is_set() else -1))
        return True

    job, claim, recording = failed_in_the_hook(
        hook, lambda claim: book().record_outcome(claim, final_failure(), hold_next=hold_next)
    )
    assert asked == []  # asked after the hook, which may have outlasted the bound
    hook.release.set()
    recorded = recording.result()

    assert [(step.position, calls) for step, calls in asked] == [(Position(0, 1), 1)]
    assert recorded is not None
    kept = row(job.id)
    assert kept.lease_owner == OWNER == recorded.record.lease_owner
    assert kept.version == recorded.record.version  # the continued attempt's write lands
    assert utcnow() < expiry(kept) <= utcnow() + timedelta(seconds=LEASE_SECONDS)
    # The continued attempt records like a claimed one.
    following = step_io.Claim(recorded.record, Position(0, 1), claim.tasks)
    done = book().record_outcome(following, step_io.Outcome(True, "done"))
    assert done is not None and done.decision.action.value == "complete"
    assert row(job.id).status is Status.COMPLETED


def test_a_job_cancelled_while_the_hook_runs_gets_no_next_step(hook: BlockingHook) -> None:
    job, _, recording = failed_in_the_hook(hook)
    assert Job.cancel_saved(job.id)

    hook.release.set()
    recorded = recording.result()

    assert recorded is None  # nothing for the caller to send
    cancelled = row(job.id)
    assert cancelled.status is Status.CANCELLED
    assert "0.0" in cancelled.state["hooks_done"]  # the hook ran and is marked done
    assert hook.calls == 1


def test_a_step_recovered_from_under_a_hook_is_not_sent_again_by_its_worker(
    hook: BlockingHook,
) -> None:
    # The worker's renewals could not reach the store and the lease lapsed: the
    # recovery sweep took the step (and sends it). After the hook, the worker
    # leaves it alone.
    job, _, recording = failed_in_the_hook(hook)
    store = get_job_store()
    later = utcnow() + timedelta(seconds=LEASE_SECONDS * 10)
    [recovered] = store.recover_expired(later, later + timedelta(seconds=DISPATCH_SECONDS))
    assert recovered.id == job.id and recovered.lease_owner is None

    hook.release.set()

    assert recording.result() is None
    after = row(job.id)
    assert after.lease_owner is None and after.lease_expires == recovered.lease_expires


def test_in_process_the_next_step_stays_held_without_expiry_while_the_hook_runs(
    hook: BlockingHook,
) -> None:
    # The in-process driver runs the next step itself, in the same thread: no
    # lease, no message, no recovery sweep sends it elsewhere (unchanged).
    job, _, recording = failed_in_the_hook(
        hook, lambda claim: book(holds_steps=True).record_outcome(claim, final_failure(), task=None)
    )
    held = row(job.id)
    assert held.lease_owner == OWNER and held.lease_expires is None
    assert held.state["hooks"]["0.0"]["until"] is None

    hook.release.set()
    recorded = recording.result()

    assert recorded is not None and recorded.record.lease_owner == OWNER
    after = row(job.id)
    assert after.lease_owner == OWNER and after.lease_expires is None
    assert "0.0" in after.state["hooks_done"]
