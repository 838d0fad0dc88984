"""The dashboard's text search, time filters and bounded counts; a job's links to its
parents and children, its tasks' progress bars and its timeline (memory and PostgreSQL)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from werkzeug.test import Client

from pypepper_dramatiq.records.links import RETRY_OF_KEY
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import IJobStore
from pypepper_dramatiq.web import app as web_app
from pypepper_dramatiq.web import make_app

from .conftest import T0, put, run_job, text, two_step_job


def ids_on(page: str) -> list[str]:
    return re.findall(r'<td class="id"><a href="/jobs/([^"]+)">', page)


def fill(store: IJobStore) -> None:
    put(store, "invoice-17", 0, status=Status.COMPLETED, category="billing")
    put(store, "report-2", 60, status=Status.FAILED, category="Monthly-Invoices")
    put(store, "cleanup-3", 120, status=Status.COMPLETED, category="ops")


def test_text_search_finds_ids_and_categories_ignoring_case(store: IJobStore) -> None:
    fill(store)
    client = Client(make_app())
    assert ids_on(text(client.get("/?q=INVOICE"))) == ["report-2", "invoice-17"]
    assert ids_on(text(client.get("/?q=clean"))) == ["cleanup-3"]
    assert ids_on(text(client.get("/?q=invoice&status=Failed"))) == ["report-2"]
    page = text(client.get("/?q=%25_%27%20OR%201=1"))
    assert ids_on(page) == [] and "No stored job matches" in page
    assert "The counts leave the text search out" in page


def test_created_between_filters_the_list_and_the_counts(store: IJobStore) -> None:
    fill(store)
    client = Client(make_app())
    start = (T0 + timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%S")
    until = (T0 + timedelta(seconds=120)).strftime("%Y-%m-%dT%H:%M")
    page = text(client.get("/", query_string={"created_from": start, "created_until": until}))
    assert ids_on(page) == ["report-2"]
    assert '<span class="count">1</span> all' in page
    assert re.search(r'<span class="count">0</span> Completed', page)
    # The filters travel with the status links.
    assert "created_from=" in re.search(r'href="([^"]*status=Failed[^"]*)"', page).group(1)
    for bad in ("yesterday", "2030-13-01", "2030-01-01T25:00"):
        response = client.get("/", query_string={"created_from": bad})
        assert response.status_code == 400 and "created_from must be a date" in text(response)


def test_counts_above_the_bound_say_more(store: IJobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(web_app, "COUNTED", 2)
    for n in range(4):
        put(store, f"done-{n}", n, status=Status.COMPLETED)
    put(store, "failed-1", 9, status=Status.FAILED)
    page = text(Client(make_app()).get("/"))
    assert re.search(r'<span class="count">2\+</span> Completed', page)
    assert re.search(r'<span class="count">1</span> Failed', page)
    assert '<span class="count">3+</span> all' in page
    assert len(ids_on(page)) == 5  # the list itself is not bounded by the counts


def test_a_job_links_to_its_parents_and_children(store: IJobStore) -> None:
    put(store, "origin", 0, status=Status.FAILED, error="ValueError: nope")
    put(
        store,
        "after-origin",
        1,
        status=Status.SCHEDULED,
        waits={"parents": ["origin"], "on_parent_failure": "ignore"},
    )
    put(
        store,
        "origin-retry",
        2,
        status=Status.COMPLETED,
        payload={RETRY_OF_KEY: "origin", "workflows": []},
    )
    client = Client(make_app())
    origin = text(client.get("/jobs/origin"))
    assert "<h2>Children</h2>" in origin
    assert '<a href="/jobs/after-origin">after-origin</a> (waits for this job)' in origin
    assert '<a href="/jobs/origin-retry">origin-retry</a> (retried as)' in origin
    retry = text(client.get("/jobs/origin-retry"))
    assert '<a href="/jobs/origin">origin</a> (retry of)' in retry
    assert 'status-failed">Failed<' in retry
    assert "<h2>Children</h2>" not in retry


def test_a_task_shows_its_last_progress_as_a_bar(store: IJobStore) -> None:
    put(
        store,
        "busy",
        0,
        status=Status.IN_PROGRESS,
        lease_owner="host:1:w",
        payload={"workflows": [{"tasks": [{"name": "crunch", "executor_id": "x"}]}]},
        state={
            "cursor": [0, 0, 0, 0],
            "progress": {
                "0.0": {
                    "task": "crunch",
                    "done": 30,
                    "total": 120,
                    "note": "<i>rows</i>",
                    "updated": T0.isoformat(),
                }
            },
        },
    )
    page = text(Client(make_app()).get("/jobs/busy"))
    assert '<progress max="120.0" value="30.0">25 %</progress> 25 %' in page
    assert "&lt;i&gt;rows&lt;/i&gt;" in page


def test_the_timeline_tells_the_jobs_story_from_its_row(store: IJobStore) -> None:
    job_id = run_job(two_step_job())
    page = text(Client(make_app()).get(f"/jobs/{job_id}"))
    timeline = page[page.index("<h2>Timeline</h2>") :]
    steps = re.findall(r"<strong>([^<]+)</strong>", timeline)
    assert steps[0] == "Created" and steps[-1] == "Completed"
    assert steps[1:-1] == [
        "fetch: attempt 1 started",
        "fetch: attempt 1 failed",
        "fetch: attempt 2 started",
        "fetch: attempt 2 succeeded",
        "load: attempt 1 started",
        "load: attempt 1 succeeded",
    ]
    assert "ValueError: first try fails: &lt;b&gt;not bold&lt;/b&gt;" in timeline


def test_a_job_page_shows_its_priority(store: IJobStore) -> None:
    put(store, "urgent", 0, status=Status.SCHEDULED, state={"priority": 7})
    put(store, "plain", 0, status=Status.SCHEDULED)
    client = Client(make_app())
    assert "<dt>Priority</dt><dd>7</dd>" in text(client.get("/jobs/urgent"))
    assert "<dt>Priority</dt><dd>0</dd>" in text(client.get("/jobs/plain"))
    listing = text(client.get("/"))
    assert re.search(r'href="/jobs/urgent">.*?<td class="priority">7</td>', listing, re.S)
    assert re.search(r'href="/jobs/plain">.*?<td class="priority">0</td>', listing, re.S)
