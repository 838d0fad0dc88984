"""Fixtures of the dashboard's tests: the process's job store (memory or PostgreSQL),
jobs made by a real in-process worker, and the forms' CSRF token."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from process_state import clean_process_state
from werkzeug.test import Client, TestResponse

from pypepper_dramatiq import Context, Job, Task, Worker, Workflow, manager, workflow_task
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import IJobStore, JobRecord
from pypepper_dramatiq.stores.memory import MemoryJobStore
from pypepper_dramatiq.stores.registry import set_job_store

#: The channel the tests' jobs use.
CHANNEL = "web"
#: When the tests' hand-made rows were created (one second apart after it).
T0 = datetime(2030, 1, 1, 12, 0, tzinfo=timezone.utc)

_lock = threading.Lock()
_tries: dict[str | None, int] = {}


@workflow_task(name="web-tests.fetch", retry_count=2, retry_delay=0)
def fetch(task: Task, context: Context, rows: int = 3) -> dict[str, Any]:
    """Fails its first attempt of each job, then returns a long result."""
    with _lock:
        _tries[context.job_id] = _tries.get(context.job_id, 0) + 1
        first = _tries[context.job_id] == 1
    if first:
        raise ValueError("first try fails: <b>not bold</b>")
    return {"rows": rows, "note": "n" * 300}


@workflow_task(name="web-tests.load")
def load(task: Task, context: Context) -> int:
    return int(context.results["fetch"]["rows"])


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest) -> Iterator[IJobStore]:
    """The process's job store, memory or PostgreSQL (``pg_store``), in clean process state."""
    with clean_process_state():
        chosen: IJobStore = (
            MemoryJobStore() if request.param == "memory" else request.getfixturevalue("pg_store")
        )
        set_job_store(chosen)
        yield chosen


def two_step_job(category: str = "etl") -> Job:
    job = Job(category=category, channel_id=CHANNEL)
    job.workflows.append(
        Workflow([fetch.task(name="fetch", channel_id=CHANNEL), load.task(name="load")])
    )
    return job


def run_job(job: Job) -> str:
    """Schedule ``job`` and run it with the in-process worker; its id."""
    manager.new(CHANNEL)
    job_id = job.scheduled()
    asyncio.run(Worker(manager.available(CHANNEL)).run_once())
    return job_id


def put(store: IJobStore, job_id: str, second: int = 0, **fields: Any) -> JobRecord:
    """Store a hand-made row created ``second`` seconds after :data:`T0`."""
    created = T0 + timedelta(seconds=second)
    fields.setdefault("channel_id", CHANNEL)
    record = JobRecord(id=job_id, created=created, updated=created, **fields)
    assert store.put(record)
    stored = store.get(job_id)
    assert stored is not None
    return stored


def put_waiting(
    store: IJobStore,
    job_id: str,
    second: int,
    parents: list[str],
    *,
    gone: list[str],
    **fields: Any,
) -> JobRecord:
    """A Scheduled row waiting for ``parents``, of which those in ``gone`` are no longer
    stored: a store takes a waiting row only while its parents are, so those are stored
    (Completed) for the insert and deleted after it, as a row deleted by hand would be."""
    for parent in gone:
        put(store, parent, second, status=Status.COMPLETED)
    waits = dict(fields.pop("waits", {}), parents=parents)
    stored = put(store, job_id, second, status=Status.SCHEDULED, waits=waits, **fields)
    for parent in gone:
        assert store.delete(parent)
    return stored


def csrf_token(client: Client, path: str) -> str:
    """The CSRF token of the forms of the page at ``path`` (a visit sets the cookie)."""
    page = client.get(path)
    assert page.status_code == 200, page.get_data(as_text=True)
    found = re.search(r'name="csrf_token" value="([^"]+)"', page.get_data(as_text=True))
    assert found, "the page has no form with a CSRF token"
    return found.group(1)


def text(response: TestResponse) -> str:
    return response.get_data(as_text=True)


class FakeServer:
    """What ``waitress.create_server`` makes, recorded instead of served: the command
    returns at once (:func:`served_by_waitress`)."""

    def __init__(self, app: Any, host: str, port: int, threads: int) -> None:
        self.app, self.host, self.port, self.threads = app, host, port, threads
        self.effective_port = port

    def run(self) -> None:
        """Serve nothing: return as a server stopped at once does."""

    def close(self) -> None:
        """Nothing to close."""


def served_by_waitress(monkeypatch: pytest.MonkeyPatch) -> list[FakeServer]:
    """The servers the ``dashboard`` command makes, in order (none serves)."""
    import waitress

    made: list[FakeServer] = []

    def create_server(app: Any, *, host: str, port: int, threads: int) -> FakeServer:
        made.append(FakeServer(app, host, port, threads))
        return made[-1]

    monkeypatch.setattr(waitress, "create_server", create_server)
    return made
