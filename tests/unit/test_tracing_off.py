"""Tracing off costs nothing: the package and a job run never import OpenTelemetry.

Run in a fresh interpreter (this test process has imported it for other tests):
``setup()`` on the stub broker, a job scheduled and run to its end by a
``dramatiq.Worker``, then ``sys.modules`` is read.
"""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import sys, time
import dramatiq
from dramatiq.brokers.stub import StubBroker
import pypepper_dramatiq
from pypepper_dramatiq import Job, Status, Workflow, get_job_store, workflow_task

@workflow_task(name="tracing-off.work")
def work(task, context):
    return "done"

broker = pypepper_dramatiq.setup(broker=StubBroker(), channels=["off"])
broker.emit_after("process_boot")
worker = dramatiq.Worker(broker, worker_timeout=50)
worker.start()
job = Job(channel_id="off")
job.workflows.append(Workflow([work.task(name="one")]))
job.scheduled()
deadline = time.monotonic() + 30
while get_job_store().get(job.id).status is not Status.COMPLETED:
    assert time.monotonic() < deadline, get_job_store().get(job.id)
    time.sleep(0.02)
worker.stop()
print(sorted(name for name in sys.modules if name.split(".")[0] == "opentelemetry"))
"""


def test_a_job_run_with_tracing_off_never_imports_opentelemetry() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_the_same_program_with_tracing_on_imports_it() -> None:
    """The check above can see an import: with ``tracing=True`` it does."""
    program = PROGRAM.replace('channels=["off"])', 'channels=["off"], tracing=True)')
    assert program != PROGRAM
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "'opentelemetry.trace'" in done.stdout.strip().splitlines()[-1]
