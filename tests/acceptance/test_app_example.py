"""``examples/app.py``: the seed's configured path, run as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.sql import SqlJobStore

APP = Path(__file__).resolve().parents[2] / "examples" / "app.py"


def run_app(*args: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, str(APP), *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_app_example_completes_on_its_default_yaml() -> None:
    status, stored, _ = run_app()
    assert (status, stored) == ("Completed", "Completed")


@pytest.mark.postgres
def test_the_app_example_stores_its_job_where_the_yaml_says(
    empty_postgres_uri: str, tmp_path: Path
) -> None:
    yaml = tmp_path / "app.config.yaml"
    yaml.write_text(
        "scheduler:\n  jobStore:\n    backend: postgres\n"
        f"    uri: {empty_postgres_uri}\n    migrate: true\n"
    )
    status, stored, job_id = run_app(str(yaml))
    assert (status, stored) == ("Completed", "Completed")
    store = SqlJobStore(empty_postgres_uri)
    try:
        record = store.get(job_id)
    finally:
        store.close()
    assert record is not None and record.status is Status.COMPLETED


def test_the_app_example_names_a_broken_yaml(tmp_path: Path) -> None:
    yaml = tmp_path / "broken.yaml"
    yaml.write_text("scheduler:\n  jobStore: [memory\n")
    done = subprocess.run(
        [sys.executable, str(APP), str(yaml)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "ConfigError" in done.stderr and "broken.yaml" in done.stderr
