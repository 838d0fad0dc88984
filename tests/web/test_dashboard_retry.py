"""The dashboard's retry action (``POST /actions/retry/<job id>``), on the memory store and
on PostgreSQL: a Failed or Cancelled job's page offers it; with a good CSRF token it
schedules ``Job.retry_saved`` and shows the new job; it is refused without a token, on a
visit, read-only, and for a job that cannot be retried, leaving every row as it was."""

from __future__ import annotations

import asyncio
import threading

import pytest
from werkzeug.test import Client

from pypepper_dramatiq import Context, Job, Task, Worker, Workflow, manager, workflow_task
from pypepper_dramatiq.records.links import RETRY_OF_KEY
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import IJobStore, JobRecord
from pypepper_dramatiq.web import make_app

from .conftest import CHANNEL, csrf_token, put, run_job, text

_lock = threading.Lock()
#: Calls of the tasks below, by task name.
CALLS: dict[str, int] = {}
#: While True, the task "second" fails.
BROKEN = {"second": True}


@workflow_task(name="web-retry.step")
def step(task: Task, context: Context) -> str:
    with _lock:
        CALLS[task.name] = CALLS.get(task.name, 0) + 1
        broken = task.name == "second" and BROKEN["second"]
    if broken:
        raise RuntimeError("second is broken")
    return f"{task.name} done"


@pytest.fixture(autouse=True)
def fresh_calls() -> None:
    with _lock:
        CALLS.clear()
        BROKEN["second"] = True


def failed_job() -> str:
    """A two-task job run by the in-process worker, Failed at its second task."""
    job = Job(category="web-retry", channel_id=CHANNEL)
    job.workflows.append(Workflow([step.task(name="first"), step.task(name="second")]))
    return run_job(job)


def payload() -> dict[str, object]:
    """The stored workflows of a job like :func:`failed_job`'s."""
    job = Job(channel_id=CHANNEL)
    job.workflows.append(Workflow([step.task(name="first"), step.task(name="second")]))
    stored = job.to_record().payload
    assert stored is not None
    return stored


def anonymous_actions() -> Client:
    return Client(make_app(allow_anonymous_actions=True))


def rows(store: IJobStore) -> list[JobRecord]:
    return sorted(store.list(), key=lambda record: record.id)


def test_retry_with_a_good_token_schedules_a_new_job_and_shows_it(store: IJobStore) -> None:
    job_id = failed_job()
    original = store.get(job_id)
    assert original is not None and original.status is Status.FAILED
    client = anonymous_actions()
    page = text(client.get(f"/jobs/{job_id}"))
    assert f'action="/actions/retry/{job_id}"' in page and ">Retry</button>" in page
    token = csrf_token(client, f"/jobs/{job_id}")

    response = client.post(f"/actions/retry/{job_id}", data={"csrf_token": token})

    assert response.status_code == 303
    location = response.headers["Location"]
    assert location.endswith("?notice=retried") and f"/jobs/{job_id}?" not in location
    new_id = location.rsplit("/jobs/", 1)[1].split("?")[0]
    new = store.get(new_id)
    assert new is not None and new.status is Status.SCHEDULED
    assert new.payload is not None and new.payload[RETRY_OF_KEY] == job_id
    assert new.state["results"] == {"0.0": "first done"}
    assert store.get(job_id) == original  # still Failed, untouched
    shown = text(client.get(location))
    assert "This job retries the one it was made from" in shown
    assert 'id="job-status">Scheduled<' in shown and ">Retry</button>" not in shown

    BROKEN["second"] = False
    asyncio.run(Worker(manager.available(CHANNEL)).run_once())
    done = store.get(new_id)
    assert done is not None and done.status is Status.COMPLETED, done
    assert CALLS == {"first": 1, "second": 2}  # first not run again


def test_a_cancelled_job_is_retried_too(store: IJobStore) -> None:
    put(store, "cancelled", 0, status=Status.CANCELLED, payload=payload())
    client = anonymous_actions()
    token = csrf_token(client, "/jobs/cancelled")
    response = client.post("/actions/retry/cancelled", data={"csrf_token": token})
    assert response.status_code == 303 and response.headers["Location"].endswith("notice=retried")
    assert len(rows(store)) == 2


def test_a_retry_without_a_good_csrf_token_or_by_a_visit_is_refused(store: IJobStore) -> None:
    job_id = failed_job()
    before = rows(store)
    client = anonymous_actions()
    token = csrf_token(client, f"/jobs/{job_id}")
    for data in ({}, {"csrf_token": ""}, {"csrf_token": token + "x"}):
        response = client.post(f"/actions/retry/{job_id}", data=data)
        assert response.status_code == 403, data
        assert "CSRF token" in text(response)
    # A good token without the browser's cookie (another browser, a cross-site form).
    fresh = anonymous_actions()
    assert fresh.post(f"/actions/retry/{job_id}", data={"csrf_token": token}).status_code == 403
    visit = client.get(f"/actions/retry/{job_id}")
    assert visit.status_code == 405 and visit.headers["Allow"] == "POST"
    assert rows(store) == before


def test_read_only_the_dashboard_offers_no_retry_and_refuses_one(store: IJobStore) -> None:
    job_id = failed_job()
    before = rows(store)
    app = make_app()
    client = Client(app)
    page = text(client.get(f"/jobs/{job_id}"))
    assert ">Retry</button>" not in page and "Retry: not available read-only." in page
    # Even with a token signed by the same key, the action is refused.
    cookie = client.get_cookie("pypepper_dashboard_csrf")
    assert cookie is not None
    response = client.post(
        f"/actions/retry/{job_id}", data={"csrf_token": app._csrf.token(cookie.value)}
    )
    assert response.status_code == 403 and "read-only" in text(response)
    assert rows(store) == before


def test_a_job_that_cannot_be_retried_is_refused_and_offers_no_retry(store: IJobStore) -> None:
    put(store, "done", 0, status=Status.COMPLETED, payload=payload())
    put(store, "bare", 1, status=Status.FAILED)  # stored without its workflows
    put(store, "waiting", 2, status=Status.SCHEDULED, payload=payload())
    before = rows(store)
    client = anonymous_actions()
    token = csrf_token(client, "/actions/cancel/waiting")  # its cancel form gives the token
    for job_id in ("done", "bare", "waiting"):
        assert ">Retry</button>" not in text(client.get(f"/jobs/{job_id}")), job_id
    done = client.post("/actions/retry/done", data={"csrf_token": token})
    assert done.status_code == 409
    assert "only a Failed or Cancelled job can be retried" in text(done)
    bare = client.post("/actions/retry/bare", data={"csrf_token": token})
    assert bare.status_code == 409 and "cannot be retried from the store" in text(bare)
    assert client.post("/actions/retry/nope", data={"csrf_token": token}).status_code == 404
    assert rows(store) == before
