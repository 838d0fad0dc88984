"""Jobs of one no-op task, for the transport tests: what carries a job matters there,
not what it runs."""

from __future__ import annotations

from pypepper_dramatiq import Context, Job, Task, Workflow, workflow_task


@workflow_task(name="transport-tests.noop")
def noop(task: Task, context: Context) -> None:
    return None


def one_task_job(channel: str, *, priority: int | None = None) -> Job:
    """A job on ``channel`` whose one task is the no-op."""
    made = Job(channel_id=channel, priority=priority)
    made.workflows.append(Workflow([noop.task(name="noop")]))
    return made
