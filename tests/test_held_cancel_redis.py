"""Cancelling a job held in the store (no message yet) gives its channel slot back.

A held job (a long delay, or a wait for other jobs) has no message, so no
worker will ever take it and give the slot back; the cancel must.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from process_state import clean_process_state

import pypepper_dramatiq
from pypepper_dramatiq import Context, Job, Task, Workflow, manager, workflow_task

pytestmark = pytest.mark.redis

CHANNEL = "held-cancel"


@workflow_task(name="held-cancel.noop")
def noop(task: Task, context: Context) -> None:
    return None


@pytest.fixture(autouse=True)
def on_redis(redis_url: str) -> Iterator[None]:
    with clean_process_state():
        broker = pypepper_dramatiq.setup(redis_url, channels={CHANNEL: 0})
        manager.available(CHANNEL).gate.reset()
        yield
        manager.available(CHANNEL).gate.reset()
        broker.close()


def job() -> Job:
    made = Job(channel_id=CHANNEL)
    made.workflows.append(Workflow([noop.task(name="noop")]))
    return made


def waiting() -> int:
    return manager.available(CHANNEL).length()


def test_cancelling_a_long_delayed_job_by_id_frees_its_slot() -> None:
    delayed = job()
    delayed.scheduled(delay=600)
    assert waiting() == 1
    assert Job.cancel_saved(delayed.id) is True
    assert waiting() == 0


def test_cancelling_a_long_delayed_job_object_frees_its_slot() -> None:
    delayed = job()
    delayed.scheduled(delay=600)
    assert delayed.cancel() is True
    assert waiting() == 0


def test_cancelling_a_job_waiting_for_a_parent_frees_its_slot() -> None:
    parent, child = job(), job()
    parent.scheduled(delay=600)
    child.scheduled(after=[parent])
    assert waiting() == 2
    assert Job.cancel_saved(child.id) is True
    assert waiting() == 1
