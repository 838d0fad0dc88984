"""The dashboard as an operator's console, through Werkzeug's test client on the memory
store and on PostgreSQL: the stored statuses in the filter, the icon, the list's task
names, durations and retries."""

from __future__ import annotations

import asyncio
import base64
import logging
import re
from datetime import timedelta

import pytest
from werkzeug.test import Client

from pypepper_dramatiq import Job, Worker, Workflow, manager
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import IJobStore
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
