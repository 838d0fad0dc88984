"""``context.idempotency_key``: ``"<job id>:<workflow>.<task>"`` on both drivers.

Every attempt of one task of one job sees the same key (a retry too, and the
task's ``on_final_failure`` hook), and another task another one.
"""

from __future__ import annotations

import threading
import uuid
from collections import defaultdict
from collections.abc import Iterator

import pytest

from pypepper_dramatiq import Context, Status, Task, workflow_task

from .drivers import Driver, make_job, run

_lock = threading.Lock()
#: The keys each call saw, per test prefix and task name, in call order.
SEEN: dict[str, list[str | None]] = defaultdict(list)


def _saw(label: str, context: Context) -> int:
    with _lock:
        SEEN[label].append(context.idempotency_key)
        return len(SEEN[label])


def _hook(task: Task, context: Context, error: str) -> None:
    _saw(f"{task.params['label']}:hook", context)


@workflow_task(name="idempotency-key.note", retry_count=1, on_final_failure=_hook)
def note(task: Task, context: Context, *, label: str, fail_first: int = 0) -> str:
    """Notes the key it sees; fails its first ``fail_first`` calls."""
    if _saw(label, context) <= fail_first:
        raise RuntimeError(f"{label}: planned failure")
    return "ok"


@pytest.fixture
def prefix() -> Iterator[str]:
    value = f"{uuid.uuid4().hex[:8]}:"
    yield value
    with _lock:
        for label in [k for k in SEEN if k.startswith(value)]:
            del SEEN[label]


def test_every_attempt_of_a_task_sees_job_id_workflow_and_task(driver: Driver, prefix: str) -> None:
    job = make_job(
        [
            note.task(name="retried", label=f"{prefix}retried", fail_first=1),
            note.task(name="second", label=f"{prefix}second"),
        ],
        [note.task(name="doomed", label=f"{prefix}doomed", fail_first=2)],
    )

    [record] = run(driver, job)

    assert record.status is Status.FAILED  # "doomed" used both its attempts
    assert SEEN[f"{prefix}retried"] == [f"{job.id}:0.0", f"{job.id}:0.0"]
    assert SEEN[f"{prefix}second"] == [f"{job.id}:0.1"]
    assert SEEN[f"{prefix}doomed"] == [f"{job.id}:1.0", f"{job.id}:1.0"]
    # The hook of the task that failed for good: the key of its attempts.
    assert SEEN[f"{prefix}doomed:hook"] == [f"{job.id}:1.0"]
