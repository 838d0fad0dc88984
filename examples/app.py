"""pypepper's configured path: load_config -> setup_from_config -> Job.scheduled -> Worker.

    python examples/app.py [path/to/app.config.yaml]

The YAML's ``scheduler.jobStore`` picks the store (memory by default; see
``conf/app.config.yaml``). Prints the job's status and the stored one.
"""

import asyncio
import sys
from pathlib import Path

from pypepper_dramatiq import (
    CallableExecutor,
    Job,
    Task,
    Worker,
    Workflow,
    config,
    manager,
    setup_from_config,
)

CONFIG = Path(__file__).with_name("conf") / "app.config.yaml"


def greet(task, context):
    return f"hello from {task.name}"


def main(config_path: Path) -> None:
    config.load_config(config_path)
    setup_from_config(config.get_yml_config())

    job = Job(category="demo", channel_id="demo-channel")
    job.workflows.append(
        Workflow(
            [
                Task(
                    "demo-channel",
                    "dag-1",
                    "fp-1",
                    "greet",
                    "demo",
                    "says hello",
                    [],
                    CallableExecutor(greet),
                    retry_count=1,
                ),
            ]
        )
    )
    job.scheduled()
    asyncio.run(Worker(manager.available("demo-channel")).run_once())

    saved = Job.get_saved(job.id)
    print(job.status.value, saved.status.value if saved else None, job.id)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else CONFIG)
