"""Executor ids of ``@workflow_task`` agree between a script and the worker importing it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
from pypepper_dramatiq import workflow_task

@workflow_task
def extract(task, context):
    return 1

print(extract.executor_id)
"""


def test_a_script_names_its_tasks_as_the_worker_imports_them(tmp_path: Path) -> None:
    (tmp_path / "etl_app.py").write_text(SCRIPT)
    as_script = subprocess.run(
        [sys.executable, "etl_app.py"], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.strip()
    as_module = subprocess.run(
        [sys.executable, "-c", "import etl_app"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    as_dash_m = subprocess.run(
        [sys.executable, "-m", "etl_app"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert as_script == as_module == as_dash_m == "etl_app.extract"


def test_an_explicit_name_wins() -> None:
    from pypepper_dramatiq import executor_registry, workflow_task

    @workflow_task(name="billing.send")
    def send(task: object, context: object) -> None:
        return None

    try:
        assert send.executor_id == "billing.send"
        assert "billing.send" in executor_registry
    finally:
        executor_registry.unregister("billing.send")
