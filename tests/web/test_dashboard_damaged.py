"""The dashboard on a row that cannot be read (changed by raw SQL on PostgreSQL), and on
a page that fails unexpectedly: every answer a page, with the security headers."""

from __future__ import annotations

import html
from collections.abc import Iterator
from typing import Any

import pytest
from process_state import clean_process_state
from sqlalchemy import text as sql
from werkzeug.test import Client

from pypepper_dramatiq.records.job_filter import JobFilter
from pypepper_dramatiq.records.recurring import RecurringSchedule
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.memory import MemoryJobStore
from pypepper_dramatiq.stores.registry import set_job_store
from pypepper_dramatiq.stores.sql import SqlJobStore
from pypepper_dramatiq.web import make_app
from pypepper_dramatiq.web.app import SECURITY_HEADERS

from .conftest import T0, csrf_token, put, text

REASON = "column 'state': expected an object, found a list"


def secured(headers: Any) -> None:
    for name, value in SECURITY_HEADERS.items():
        assert headers.get(name) == value, name


@pytest.fixture
def damaged(pg_store: SqlJobStore) -> Iterator[SqlJobStore]:
    """The issue's probe: a Scheduled row whose state is a list, next to whole rows."""
    with clean_process_state():
        set_job_store(pg_store)
        put(pg_store, "whole-old", 0, status=Status.COMPLETED)
        put(pg_store, "broken", 1, status=Status.SCHEDULED, category="etl")
        put(pg_store, "whole-new", 2, status=Status.FAILED, error="E: boom")
        with pg_store.engine.begin() as conn:
            conn.execute(sql("UPDATE scheduler_jobs SET state = '[1,2,3]' WHERE id = 'broken'"))
        yield pg_store


@pytest.mark.postgres
def test_the_jobs_page_lists_the_damaged_row_marked(damaged: SqlJobStore) -> None:
    response = Client(make_app()).get("/")
    assert response.status_code == 200
    secured(response.headers)
    page = html.unescape(text(response))
    for job_id in ("whole-old", "broken", "whole-new"):
        assert f'href="/jobs/{job_id}"' in page
    row = page.split('href="/jobs/broken"')[1].split("</tr>")[0]
    assert 'class="badge status-damaged"' in row and ">Damaged</span>" in row
    assert REASON in row
    whole = page.split('href="/jobs/whole-new"')[1].split("</tr>")[0]
    assert ">Failed</span>" in whole


@pytest.mark.postgres
def test_the_damaged_jobs_page_shows_the_reason_and_what_could_be_read(
    damaged: SqlJobStore,
) -> None:
    response = Client(make_app()).get("/jobs/broken")
    assert response.status_code == 200
    secured(response.headers)
    page = html.unescape(text(response))
    assert '<p class="error-text" id="damage">' + REASON + "</p>" in page
    assert "<dt>Stored status</dt><dd>Scheduled</dd>" in page
    assert "<dt>Category</dt><dd>etl</dd>" in page
    assert "<dt>Created</dt><dd>2030-01-01 12:00:01Z</dd>" in page
    assert "Cancel job" not in page
    assert Client(make_app()).get("/jobs/whole-new").status_code == 200


@pytest.mark.postgres
def test_an_unreadable_status_is_shown_as_such(damaged: SqlJobStore) -> None:
    with damaged.engine.begin() as conn:
        conn.execute(sql("UPDATE scheduler_jobs SET status = 'Bogus' WHERE id = 'whole-old'"))
    page = html.unescape(text(Client(make_app()).get("/jobs/whole-old")))
    assert "column 'status': expected a status, found 'Bogus', which names none" in page
    assert "<dt>Stored status</dt><dd>(cannot be read)</dd>" in page


@pytest.mark.postgres
def test_an_action_on_a_damaged_row_is_refused_with_the_reason(damaged: SqlJobStore) -> None:
    put(damaged, "cancellable", 3, status=Status.SCHEDULED)
    client = Client(make_app(allow_anonymous_actions=True))
    token = csrf_token(client, "/actions/cancel/cancellable")
    response = client.post("/actions/cancel/broken", data={"csrf_token": token})
    assert response.status_code == 409
    secured(response.headers)
    assert "job broken: stored row is damaged: " + REASON in html.unescape(text(response))


class Failing(MemoryJobStore):
    """A store whose listing fails with an error no page expects."""

    def list_matching(self, where: JobFilter, **page: Any) -> Any:
        raise RuntimeError("unexpected")


def test_an_unexpected_error_answers_a_500_page_with_the_security_headers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with clean_process_state():
        response = Client(make_app(Failing())).get("/")
    assert response.status_code == 500
    secured(response.headers)
    assert "the server&#39;s log says why" in text(response)
    assert any("dashboard: GET / failed" in r.getMessage() for r in caplog.records)


def test_an_error_page_that_cannot_be_rendered_still_has_the_headers() -> None:
    def auth(environ: Any) -> bool:
        raise RuntimeError("the auth callable failed")

    with clean_process_state():
        response = Client(make_app(MemoryJobStore(), auth=auth)).get("/")
    assert response.status_code == 500
    secured(response.headers)
    assert response.mimetype == "text/plain"


@pytest.mark.postgres
def test_the_schedules_page_marks_a_damaged_schedule_and_offers_no_action(
    damaged: SqlJobStore,
) -> None:
    template = {"channel_id": "web", "category": None, "payload": {"workflows": []}}
    for name in ("good", "bad"):
        damaged.save_recurring(RecurringSchedule(name, "0 6 * * *", "UTC", template, T0))
    with damaged.engine.begin() as conn:
        conn.execute(
            sql("UPDATE scheduler_recurring SET timezone = 'Mars/Base' WHERE name = 'bad'")
        )
    client = Client(make_app(allow_anonymous_actions=True))
    response = client.get("/schedules")
    assert response.status_code == 200
    page = html.unescape(text(response))
    bad = page.split("<td>bad</td>")[1].split("</tr>")[0]
    assert ">Damaged</span>" in bad and "Mars/Base" in bad
    assert "column 'timezone': expected an IANA time zone" in bad
    assert "Trigger now" not in bad and "Pause" not in bad
    assert "Trigger now" in page.split("<td>good</td>")[1].split("</tr>")[0]
    token = csrf_token(client, "/schedules")
    refused = client.post("/actions/pause/bad", data={"csrf_token": token})
    assert refused.status_code == 409
    secured(refused.headers)
    assert "recurring schedule bad: stored row is damaged" in html.unescape(text(refused))
