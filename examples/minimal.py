"""The seed's minimal example, with only the imports changed."""

import asyncio

from pypepper_dramatiq.channel import manager
from pypepper_dramatiq.executor import CallableExecutor
from pypepper_dramatiq.job import Job
from pypepper_dramatiq.task import Task
from pypepper_dramatiq.worker import Worker
from pypepper_dramatiq.workflow import Workflow


def work(task, context):
    return {"ok": True, "task": task.name}


workflow = Workflow()
workflow.add_task(
    Task(
        channel_id="demo-channel",
        dag_id="dag-1",
        fingerprint="fp-1",
        name="step-1",
        category="demo",
        description="first step",
        tags=[],
        executor=CallableExecutor(work),
        retry_count=1,
        retry_delay=0,
        optional=False,
    )
)

job = Job(category="demo", channel_id="demo-channel")
job.workflows.append(workflow)
# Optional: create a bounded channel *before* worker/dispatch (default is unbounded).
# manager.new("demo-channel", maxsize=100)
job.scheduled()  # dispatch into channel via Dispatcher

worker = Worker(manager.available("demo-channel"))
asyncio.run(worker.run_once())
print(job.status)
