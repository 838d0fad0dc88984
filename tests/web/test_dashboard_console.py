"""The dashboard as an operator's console, through Werkzeug's test client on the memory
store and on PostgreSQL: the stored statuses in the filter, the icon, the list's task
names, durations and retries."""

from __future__ import annotations

import asyncio
import base64
import html
import logging
import re
from datetime import datetime, timedelta

import pytest
from werkzeug.test import Client

from pypepper_dramatiq import Job, Worker, Workflow, manager
from pypepper_dramatiq.records.record import utcnow
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import IJobStore, JobRecord
from pypepper_dramatiq.web import basic_auth, make_app

from .conftest import CHANNEL, T0, fetch, load, put, run_job, text, two_step_job

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


# -- channel actions ----------------------------------------------------------------------


def user_client(app_user: str = "ops") -> Client:
    """A client of a dashboard with basic auth, signed in as ``app_user``."""
    return Client(make_app(auth=basic_auth(app_user, "pw")))


def signed_in(user: str = "ops") -> dict[str, str]:
    token = base64.b64encode(f"{user}:pw".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def test_a_channel_is_stopped_resumed_and_resized_by_who_is_signed_in(
    store: IJobStore, caplog: pytest.LogCaptureFixture
) -> None:
    channel = manager.new(CHANNEL, maxsize=5)
    client = user_client()
    headers = signed_in()
    page = client.get("/channels", headers=headers)
    token = re.findall(r'name="csrf_token" value="([^"]+)"', text(page))[0]
    assert f'action="/actions/channel/stop/{CHANNEL}"' in text(page)
    caplog.set_level(logging.INFO, logger="pypepper_dramatiq.web.app")

    stop = client.post(
        f"/actions/channel/stop/{CHANNEL}", data={"csrf_token": token}, headers=headers
    )
    assert stop.status_code == 303 and stop.headers["Location"].endswith("notice=channel_stopped")
    assert channel.stop
    shown = text(client.get(stop.headers["Location"], headers=headers))
    assert "The channel is stopped" in shown
    assert f'action="/actions/channel/resume/{CHANNEL}"' in shown

    resume = client.post(
        f"/actions/channel/resume/{CHANNEL}", data={"csrf_token": token}, headers=headers
    )
    assert resume.status_code == 303 and not channel.stop
    resize = client.post(
        f"/actions/channel/resize/{CHANNEL}",
        data={"csrf_token": token, "size": "9"},
        headers=headers,
    )
    assert resize.headers["Location"].endswith("notice=channel_resized") and channel.maxsize == 9
    same = client.post(
        f"/actions/channel/resize/{CHANNEL}",
        data={"csrf_token": token, "size": "9"},
        headers=headers,
    )
    assert same.headers["Location"].endswith("notice=channel_unchanged")
    said = [r.getMessage() for r in caplog.records if "dashboard: channel" in r.getMessage()]
    assert said == [
        f"dashboard: channel {CHANNEL} stopped by dashboard:ops",
        f"dashboard: channel {CHANNEL} resumed by dashboard:ops",
        f"dashboard: channel {CHANNEL} resized by dashboard:ops: bound 5 -> 9",
        f"dashboard: channel {CHANNEL} resized by dashboard:ops: bound 9 -> 9",
    ]


def test_channel_actions_are_refused_without_a_token_read_only_or_signed_out(
    store: IJobStore,
) -> None:
    channel = manager.new(CHANNEL, maxsize=5)
    client = user_client()
    headers = signed_in()
    token = csrf_token_of(client, "/channels", headers)
    for data in ({}, {"csrf_token": token + "x"}):
        refused = client.post(f"/actions/channel/stop/{CHANNEL}", data=data, headers=headers)
        assert refused.status_code == 403 and "CSRF token" in text(refused)
    signed_out = client.post(f"/actions/channel/stop/{CHANNEL}", data={"csrf_token": token})
    assert signed_out.status_code == 401
    visit = client.get(f"/actions/channel/stop/{CHANNEL}", headers=headers)
    assert visit.status_code == 405
    read_only = Client(make_app())
    page = text(read_only.get("/channels"))
    assert "/actions/channel/" not in page
    cookie = read_only.get_cookie("pypepper_dashboard_csrf")
    assert cookie is not None
    app = make_app()
    response = Client(app).post(
        f"/actions/channel/stop/{CHANNEL}", data={"csrf_token": app._csrf.token(cookie.value)}
    )
    assert response.status_code == 403 and "read-only" in text(response)
    assert not channel.stop and channel.maxsize == 5


def test_a_bad_bound_or_an_unknown_channel_changes_nothing(store: IJobStore) -> None:
    channel = manager.new(CHANNEL, maxsize=5)
    client = user_client()
    headers = signed_in()
    token = csrf_token_of(client, "/channels", headers)
    for size in ("", "-1", "x", "1.5", "1000000001"):
        bad = client.post(
            f"/actions/channel/resize/{CHANNEL}",
            data={"csrf_token": token, "size": size},
            headers=headers,
        )
        assert bad.status_code == 400 and "whole number" in text(bad), size
    unknown = client.post("/actions/channel/stop/nope", data={"csrf_token": token}, headers=headers)
    assert unknown.status_code == 404 and "No channel" in text(unknown)
    assert not channel.stop and channel.maxsize == 5


def csrf_token_of(client: Client, path: str, headers: dict[str, str]) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', text(client.get(path, headers=headers)))
    assert found
    return found.group(1)


# -- search in errors ---------------------------------------------------------------------


def ids_on(page: str) -> list[str]:
    return re.findall(r'<td class="id"><a href="/jobs/([^"]+)">', page)


def test_the_search_finds_a_job_by_its_errors_text(store: IJobStore) -> None:
    put(store, "quiet", 0, status=Status.COMPLETED)
    put(store, "loud", 1, status=Status.FAILED, error="OSError: disk quota exceeded on /srv")
    put(store, "other", 2, status=Status.FAILED, error="KeyError: 'x'")
    page = text(Client(make_app()).get("/?q=QUOTA+exceeded"))
    assert ids_on(page) == ["loud"]
    assert "search-more" not in page


def test_a_search_reads_a_window_of_jobs_and_offers_the_next(store: IJobStore) -> None:
    for n in range(8):  # newest first: m7 ... m0; the even ones hold the text
        error = f"Timeout talking to db {n}" if n % 2 == 0 else "other"
        put(store, f"m{n}", n, status=Status.FAILED, error=error)
    app = make_app()
    app.search_window = 3
    client = Client(app)
    seen: list[list[str]] = []
    path = "/?q=timeout"
    while True:
        page = text(client.get(path))
        seen.append(ids_on(page))
        found = re.search(r'class="search-more" href="([^"]+)"', page)
        if found is None:
            break
        assert "Search the next 3 jobs" in page
        path = found.group(1).replace("&amp;", "&")
    # Windows m7-m5, m4-m2, m1-m0: each job read once, in order.
    assert seen == [["m6"], ["m4", "m2"], ["m0"]]


def test_a_full_page_of_matches_pages_on_before_the_window_ends(store: IJobStore) -> None:
    for n in range(6):
        put(store, f"p{n}", n, status=Status.FAILED, error="Boom")
    app = make_app()
    app.search_window = 5
    client = Client(app)
    first = text(client.get("/?q=boom&limit=2"))
    assert ids_on(first) == ["p5", "p4"] and "search-more" not in first
    older = re.search(r'rel="next" href="([^"]+)"', first)
    assert older is not None
    second = text(client.get(older.group(1).replace("&amp;", "&")))
    assert ids_on(second)[:1] == ["p3"]


# -- schedules ----------------------------------------------------------------------------


def test_a_schedule_shows_its_cron_in_words_and_its_latest_firings(store: IJobStore) -> None:
    from pypepper_dramatiq.schedules.firing import fire_due, recurring

    manager.new(CHANNEL)
    template = Job(category="tick", channel_id=CHANNEL)
    template.workflows.append(Workflow([load.task(name="load")]))  # fails: no fetch result
    schedule = recurring("ticks", "*/10 * * * *", template, overlap="allow", catch_up="all")
    # Its next slot moved back: three slots are due now (slots in the past run at once).
    start = schedule.next_slot - timedelta(minutes=40)
    assert store.advance_recurring(schedule.evolve(next_slot=start))
    fired = fire_due(now=start + timedelta(minutes=25))
    assert len(fired) == 3
    asyncio.run(Worker(manager.available(CHANNEL)).run_once())  # runs (and fails) one
    ran = [job_id for job_id in fired if store.get(job_id).status is Status.FAILED]  # type: ignore[union-attr]
    assert len(ran) == 1
    recurring("hourly", "@hourly", template)  # never fired
    page = text(Client(make_app()).get("/schedules"))
    row = page.split("<td>ticks</td>", 1)[1].split("</tr>", 1)[0]
    assert '<code>*/10 * * * *</code><span class="cron-words">Every 10 minutes</span>' in row
    shown = re.findall(r'<a href="/jobs/([^"]+)"><span class="badge status-(\w+)">', row)
    newest_first = sorted(fired, reverse=True)  # a firing's id ends with its slot
    assert [job_id for job_id, _ in shown] == newest_first
    assert {job_id: status for job_id, status in shown}[ran[0]] == "failed"
    assert sorted(status for _, status in shown) == ["failed", "scheduled", "scheduled"]
    hourly = page.split("<td>hourly</td>", 1)[1].split("</tr>", 1)[0]
    assert '<span class="cron-words">Once an hour, at minute 0</span>' in hourly


def test_an_expression_without_words_is_shown_alone(store: IJobStore) -> None:
    from pypepper_dramatiq.web.cron_words import in_words

    assert in_words("0 30 2 * * *") == "At 02:30"  # six fields: seconds first
    assert in_words("not a cron") is None
    assert in_words("1 2 3 4 5 6 7 8") is None


# -- bulk actions -------------------------------------------------------------------------


def workflows() -> dict[str, object]:
    """The stored workflows of a job the tests' worker can run."""
    stored = two_step_job().to_record().payload
    assert stored is not None
    return stored


def confirm_form(page: str) -> tuple[str, list[str]]:
    """The CSRF token and the job ids of a bulk confirmation page's form."""
    form = page.split('id="confirm-bulk"', 1)[1].split("</form>", 1)[0]
    token = re.search(r'name="csrf_token" value="([^"]+)"', form)
    assert token is not None
    return token.group(1), re.findall(r'name="ids" value="([^"]+)"', form)


def test_retry_the_failed_jobs_of_a_filter_after_confirming(
    store: IJobStore, caplog: pytest.LogCaptureFixture
) -> None:
    manager.new(CHANNEL)
    for n in range(3):
        put(store, f"f{n}", n, status=Status.FAILED, payload=workflows(), error="Boom")
    put(store, "elsewhere", 3, status=Status.FAILED, payload=workflows(), channel_id="other")
    put(store, "fine", 4, status=Status.COMPLETED, payload=workflows())
    client, headers = user_client(), signed_in()
    listing = text(client.get(f"/?channel={CHANNEL}", headers=headers))
    link = re.search(r'href="(/actions/bulk/retry\?[^"]+)"', listing)
    assert link is not None and f"channel={CHANNEL}" in link.group(1)
    confirm = text(client.get(link.group(1).replace("&amp;", "&"), headers=headers))
    assert '<h1 id="bulk-title">Retry 3 failed jobs?</h1>' in confirm
    assert "at most 100 jobs" in confirm
    token, job_ids = confirm_form(confirm)
    assert job_ids == ["f0", "f1", "f2"]
    caplog.set_level(logging.INFO, logger="pypepper_dramatiq.web.app")

    done = client.post(
        "/actions/bulk/retry", data={"csrf_token": token, "ids": job_ids}, headers=headers
    )
    assert done.status_code == 200
    assert '<h1 id="bulk-done">3 of 3 jobs retried</h1>' in text(done)
    retries = [r for r in store.list() if (r.payload or {}).get("retry_of")]
    assert sorted(str((r.payload or {})["retry_of"]) for r in retries) == job_ids
    assert all(r.status is Status.SCHEDULED for r in retries)
    said = [r.getMessage() for r in caplog.records if "bulk retry" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("dashboard: bulk retry by dashboard:ops: 3 of 3")

    again = client.post(
        "/actions/bulk/retry", data={"csrf_token": token, "ids": job_ids}, headers=headers
    )
    assert '<h1 id="bulk-done">0 of 0 jobs retried</h1>' in text(again)
    assert "3 of the jobs sent were left out" in text(again)
    assert len([r for r in store.list() if (r.payload or {}).get("retry_of")]) == 3


def test_cancel_a_selection_cancels_only_its_waiting_jobs_as_who_did_it(store: IJobStore) -> None:
    put(store, "w1", 0, status=Status.SCHEDULED, payload=workflows())
    put(store, "w2", 1, status=Status.SCHEDULED, payload=workflows())
    put(store, "ended", 2, status=Status.COMPLETED, payload=workflows())
    client, headers = user_client(), signed_in()
    listing = text(client.get("/", headers=headers))
    assert 'name="ids" value="w1" form="selection"' in listing
    confirm = text(client.get("/actions/bulk/cancel?ids=w2&ids=ended&ids=nope", headers=headers))
    assert '<h1 id="bulk-title">Cancel 1 waiting jobs?</h1>' in confirm
    assert "2 of the jobs selected are left out" in confirm
    token, job_ids = confirm_form(confirm)
    assert job_ids == ["w2"]
    done = client.post(
        "/actions/bulk/cancel", data={"csrf_token": token, "ids": job_ids}, headers=headers
    )
    assert '<h1 id="bulk-done">1 of 1 jobs cancelled</h1>' in text(done)
    w2, w1 = store.get("w2"), store.get("w1")
    assert w2 is not None and w2.status is Status.CANCELLED
    assert w2.state["cancelled_by"]["by"] == "dashboard:ops"
    assert w1 is not None and w1.status is Status.SCHEDULED


def test_bulk_actions_are_refused_without_a_token_read_only_signed_out_or_too_many(
    store: IJobStore,
) -> None:
    put(store, "w1", 0, status=Status.SCHEDULED, payload=workflows())
    client, headers = user_client(), signed_in()
    token, _ = confirm_form(text(client.get("/actions/bulk/cancel?ids=w1", headers=headers)))
    for data in ({"ids": "w1"}, {"ids": "w1", "csrf_token": token + "x"}):
        refused = client.post("/actions/bulk/cancel", data=data, headers=headers)
        assert refused.status_code == 403 and "CSRF token" in text(refused)
    signed_out = client.post("/actions/bulk/cancel", data={"csrf_token": token, "ids": "w1"})
    assert signed_out.status_code == 401
    many = [f"id-{n}" for n in range(101)]
    too_many = client.post(
        "/actions/bulk/cancel", data={"csrf_token": token, "ids": many}, headers=headers
    )
    assert too_many.status_code == 400 and "at most 100 jobs" in text(too_many)
    none = client.post("/actions/bulk/cancel", data={"csrf_token": token}, headers=headers)
    assert none.status_code == 400
    searched = client.get("/actions/bulk/retry?q=boom", headers=headers)
    assert searched.status_code == 400
    read_only = Client(make_app())
    assert "/actions/bulk/" not in text(read_only.get("/"))
    assert read_only.get("/actions/bulk/cancel?ids=w1").status_code == 403
    cookie = read_only.get_cookie("pypepper_dashboard_csrf")
    assert cookie is not None
    app = make_app()
    response = Client(app).post(
        "/actions/bulk/cancel", data={"csrf_token": app._csrf.token(cookie.value), "ids": "w1"}
    )
    assert response.status_code == 403 and "read-only" in text(response)
    record = store.get("w1")
    assert record is not None and record.status is Status.SCHEDULED


def test_a_filter_touches_at_most_the_bound_oldest_first(store: IJobStore) -> None:
    for n in range(103):
        put(store, f"s{n:03d}", n, status=Status.SCHEDULED)
    client, headers = user_client(), signed_in()
    confirm = text(client.get("/actions/bulk/cancel", headers=headers))
    assert '<h1 id="bulk-title">Cancel 100 waiting jobs?</h1>' in confirm
    assert "more match: the first 100, oldest first" in confirm
    _, job_ids = confirm_form(confirm)
    assert job_ids == [f"s{n:03d}" for n in range(100)]


def test_an_id_with_a_bidi_control_goes_through_a_bulk_form_exactly(store: IJobStore) -> None:
    spoofed = "w\u202e1"
    put(store, spoofed, 0, status=Status.SCHEDULED)
    client, headers = user_client(), signed_in()
    listing = text(client.get("/", headers=headers))
    assert "\u202e" not in listing and 'value="w&#x202E;1" form="selection"' in listing
    confirm = text(
        client.get("/actions/bulk/cancel", query_string={"ids": spoofed}, headers=headers)
    )
    assert "\u202e" not in confirm
    token, job_ids = confirm_form(confirm)
    sent = [html.unescape(job_id) for job_id in job_ids]  # what a browser sends
    assert sent == [spoofed]
    client.post("/actions/bulk/cancel", data={"csrf_token": token, "ids": sent}, headers=headers)
    record = store.get(spoofed)
    assert record is not None and record.status is Status.CANCELLED


# -- charts -------------------------------------------------------------------------------


def ended(store: IJobStore, job_id: str, status: Status, at: datetime) -> None:
    assert store.put(
        JobRecord(id=job_id, channel_id=CHANNEL, status=status, created=at, updated=at)
    )


def test_the_charts_page_draws_the_jobs_ended_per_minute_by_status(store: IJobStore) -> None:
    at = utcnow() - timedelta(minutes=5)  # one instant: one bucket
    for n in range(3):
        ended(store, f"ok{n}", Status.COMPLETED, at)
    ended(store, "bad", Status.FAILED, at)
    ended(store, "old", Status.FAILED, at - timedelta(hours=3))
    put(store, "waiting", 0, status=Status.SCHEDULED)
    client = Client(make_app())
    page = text(client.get("/charts"))
    assert 'href="/charts" aria-current="page">Charts</a>' in page
    titles = re.findall(
        r'<rect class="bar status-(\w+)"[^>]*><title>[^<]*: (\d+) (\w+)</title>', page
    )
    assert sorted(titles) == [("completed", "3", "Completed"), ("failed", "1", "Failed")]
    assert ">3 Completed</span>" in page and ">1 Failed</span>" in page
    day = text(client.get("/charts?range=day"))
    assert ">2 Failed</span>" in day  # the one of three hours ago too
    assert client.get("/charts?range=week").status_code == 200
    assert client.get("/charts?range=year").status_code == 400


def test_an_empty_range_says_so(store: IJobStore) -> None:
    page = text(Client(make_app()).get("/charts"))
    assert "No job ended in this range." in page and "<rect" not in page
