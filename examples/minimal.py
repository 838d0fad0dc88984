"""The smallest pypepper-dramatiq job: two tasks, run in this process, in a second.

Nothing to start first: the job's state lives in an in-memory job store, and its
channel is a queue of Dramatiq's in-memory broker. It prints what happened, where
the state lives, and what to try next.

    python examples/minimal.py
"""

import asyncio

from pypepper_dramatiq import Job, Worker, Workflow, get_job_store, manager, workflow_task


@workflow_task(retry_count=1)
def extract(task, context):
    """Read three rows."""
    return {"rows": [1, 2, 3]}


@workflow_task
def total(task, context):
    """Add up what extract read."""
    return sum(context.results["extract"]["rows"])


job = Job(category="demo", channel_id="demo")
job.workflows.append(Workflow([extract.task(), total.task()]))
# Optional: a bounded channel, made before the job is sent (default: unbounded).
# manager.new("demo", maxsize=100)
job.scheduled()  # sent to the channel "demo" and stored, Scheduled
asyncio.run(Worker(manager.available("demo")).run_once())  # runs it here, now

saved = Job.get_saved(job.id)
print(f"job {job.id}: {saved.status} (channel {saved.channel_id!r}, run in this process)")
for name in ("extract", "total"):
    print(f"  task {name}: returned {job.result(name)!r}")
print(
    f"Its state is in this process's memory ({type(get_job_store()).__name__}): "
    "gone when it exits.\n"
    '  To keep it in PostgreSQL, call configure_job_store("postgres",\n'
    '  uri="postgresql+psycopg://user:pass@localhost/jobs", migrate=True) first.\n'
    "Next:\n"
    "  - run the tasks on dramatiq worker processes (Redis and PostgreSQL):\n"
    '    README.md, "Distributed in two steps"; then docs/tutorial.md\n'
    "  - watch the jobs in a browser: pip install 'pypepper-dramatiq[dashboard]', then\n"
    "    pypepper-dramatiq dashboard --uri postgresql+psycopg://user:pass@localhost/jobs"
)
