"""The dashboard as an operator's console, through Werkzeug's test client on the memory
store and on PostgreSQL: the stored statuses in the filter, the icon, the list's task
names, durations and retries."""

from __future__ import annotations

import re
from datetime import timedelta

from werkzeug.test import Client

from pypepper_dramatiq import Job, Workflow
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import IJobStore
from pypepper_dramatiq.web import make_app

from .conftest import CHANNEL, T0, fetch, put, run_job, text, two_step_job

# -- the jobs list ----------------------------------------------------------------------------


def test_the_status_filter_offers_only_statuses_a_stored_job_has(store: IJobStore) -> None:
    client = Client(make_app())
    page = text(client.get("/"))
    offered = re.findall(r'<option value="([^"]*)"', page)
    assert offered == ["", "Scheduled", "InProgress", "Completed", "Failed", "Cancelled"]
    assert "> Initializing</a>" not in page and "> Unknown</a>" not in page
    for status in ("Unknown", "Initializing"):
        assert client.get(f"/?status={status}").status_code == 400, status


def test_the_icon_is_served_and_named_by_every_page(store: IJobStore) -> None:
    client = Client(make_app())
    for path in ("/", "/schedules", "/channels", "/workers"):
        assert 'rel="icon" type="image/svg+xml" href="/static/favicon.svg"' in text(
            client.get(path)
        ), path
    for path in ("/favicon.ico", "/static/favicon.svg"):
        response = client.get(path)
        assert response.status_code == 200, path
        assert response.mimetype == "image/svg+xml"
        assert text(response).startswith("<svg ")
        response.close()


def row_of(page: str, job_id: str) -> str:
    """The table row of ``job_id`` on a list page."""
    return page.split(f'<a href="/jobs/{job_id}">{job_id}</a>', 1)[1].split("</tr>", 1)[0]


def test_the_list_shows_each_jobs_tasks_and_how_long_an_ended_one_took(
    store: IJobStore,
) -> None:
    done = run_job(two_step_job())
    put(store, "ended", 0, status=Status.COMPLETED)
    stored = store.get("ended")
    assert stored is not None
    assert store.put(stored.evolve(updated=T0 + timedelta(minutes=3, seconds=5)))
    put(store, "waiting", 1, status=Status.SCHEDULED)
    page = text(Client(make_app()).get("/"))
    assert '<td class="tasks">fetch, load</td>' in row_of(page, done)
    assert re.search(r'title="updated [^"]+">\d+\.\ds</td>', row_of(page, done))
    assert '">3m 05s</td>' in row_of(page, "ended")
    assert '<td class="tasks">-</td>' in row_of(page, "waiting")
    assert '">-</td>' in row_of(page, "waiting")


def test_a_long_workflow_names_its_first_tasks_and_counts_the_rest(store: IJobStore) -> None:
    job = Job(channel_id=CHANNEL)
    job.workflows.append(Workflow([fetch.task(name=f"t{i}") for i in range(5)]))
    put(store, "long", 0, status=Status.SCHEDULED, payload=job.to_record().payload)
    page = text(Client(make_app()).get("/"))
    assert '<td class="tasks">t0, t1, t2 and 2 more</td>' in row_of(page, "long")


def test_a_failed_job_later_retried_links_its_retry(store: IJobStore) -> None:
    failed = run_job(two_step_job())  # fetch fails its first attempt, then succeeds
    record = store.get(failed)
    assert record is not None
    # A Failed job of the same workflows, retried by the package's call.
    put(store, "broken", 0, status=Status.FAILED, payload=record.payload, error="Boom")
    new_id = Job.retry_saved("broken")
    page = text(Client(make_app()).get("/"))
    shown = row_of(page, "broken")
    assert f'retried as <a href="/jobs/{new_id}">{new_id}</a>' in shown
    assert "retried as" not in row_of(page, failed)
