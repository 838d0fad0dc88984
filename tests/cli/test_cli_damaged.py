"""``pypepper-dramatiq show`` and ``jobs`` on a row changed by raw SQL, run as the shell runs
them (a subprocess), on the real PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
from process_state import clean_process_state
from sqlalchemy import text

from pypepper_dramatiq import Job
from pypepper_dramatiq.errors import CorruptRecordError
from pypepper_dramatiq.records.recurring import RecurringSchedule
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import JobRecord
from pypepper_dramatiq.stores.registry import set_job_store
from pypepper_dramatiq.stores.sql import SqlJobStore

pytestmark = pytest.mark.postgres

T0 = datetime(2024, 1, 1, 12, 0, tzinfo=timezone.utc)
#: The console script installed next to this interpreter.
COMMAND = str(Path(sys.executable).with_name("pypepper-dramatiq"))


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [COMMAND, *args], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture
def damaged(pg_store: SqlJobStore) -> SqlJobStore:
    """A Scheduled row "broken" whose state is a list (the issue's probe), and a whole one."""
    assert pg_store.put(JobRecord(id="whole", status=Status.COMPLETED, created=T0, updated=T0))
    assert pg_store.put(JobRecord(id="broken", status=Status.SCHEDULED, created=T0, updated=T0))
    with pg_store.engine.begin() as conn:
        conn.execute(text("UPDATE scheduler_jobs SET state = '[1,2,3]' WHERE id = 'broken'"))
    return pg_store


def test_show_names_the_job_and_the_column_and_fails(
    damaged: SqlJobStore, postgres_uri: str
) -> None:
    done = cli("show", "broken", "--uri", postgres_uri)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith(
        "pypepper-dramatiq: job broken: stored row is damaged: column 'state': "
        "expected an object, found a list"
    )
    assert "Traceback" not in done.stderr
    assert cli("show", "whole", "--uri", postgres_uri).returncode == 0


def test_jobs_lists_the_damaged_row_marked(damaged: SqlJobStore, postgres_uri: str) -> None:
    done = cli("jobs", "--uri", postgres_uri)
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines()[1:]}
    assert set(rows) == {"broken", "whole"}
    assert rows["broken"].split()[1] == "damaged"
    assert "column 'state': expected an object, found a list" in rows["broken"]
    assert rows["whole"].split()[1] == "Completed"
    listed = [
        json.loads(line)
        for line in cli("jobs", "--json", "--uri", postgres_uri).stdout.splitlines()
    ]
    by_id = {row["id"]: row for row in listed}
    assert by_id["broken"]["damaged"] == "column 'state': expected an object, found a list"
    assert by_id["broken"]["status"] == "Scheduled" and "damaged" not in by_id["whole"]


def test_job_get_saved_raises_the_typed_error(damaged: SqlJobStore) -> None:
    with clean_process_state():
        set_job_store(damaged)
        with pytest.raises(CorruptRecordError) as caught:
            Job.get_saved("broken")
        assert (caught.value.job_id, caught.value.column) == ("broken", "state")
        saved = Job.get_saved("whole")
        assert saved is not None and saved.status is Status.COMPLETED


def test_recurring_lists_a_damaged_schedule_marked(
    pg_store: SqlJobStore, postgres_uri: str
) -> None:
    template = {"channel_id": "c", "category": None, "payload": {"workflows": []}}
    pg_store.save_recurring(RecurringSchedule("nightly", "0 6 * * *", "UTC", template, T0))
    with pg_store.engine.begin() as conn:
        conn.execute(text("UPDATE scheduler_recurring SET template = '[1]' WHERE name = 'nightly'"))
    done = cli("recurring", "--uri", postgres_uri)
    assert done.returncode == 0, done.stderr
    (row,) = done.stdout.splitlines()[1:]
    assert row.split()[0] == "nightly" and row.split()[-1] == "damaged"
    listed = cli("recurring", "--json", "--uri", postgres_uri).stdout.splitlines()
    (shown,) = [json.loads(line) for line in listed]
    assert shown["damaged"] == "column 'template': expected an object, found a list"
