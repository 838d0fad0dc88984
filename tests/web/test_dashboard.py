"""The dashboard through Werkzeug's test client, on the memory store and on PostgreSQL.

Pages (list, filters, cursor pages, counts, one job's history and waits), escaping of
hostile text, CSRF, read-only mode, access (an ``auth`` callable, basic auth), the
actions (cancel; pause, resume, trigger a schedule), and mounting under a prefix.
"""

from __future__ import annotations

import base64
import html
import re
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from werkzeug.test import Client

from pypepper_dramatiq.cli.commands import decode_cursor as cli_decode_cursor
from pypepper_dramatiq.cli.commands import encode_cursor as cli_encode_cursor
from pypepper_dramatiq.cli.commands import main
from pypepper_dramatiq.records.recurring import RecurringSchedule
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.schedules.firing import pause_recurring, resume_recurring
from pypepper_dramatiq.stores.base import IJobStore, JobFilter
from pypepper_dramatiq.stores.memory import MemoryJobStore
from pypepper_dramatiq.stores.registry import set_job_store
from pypepper_dramatiq.web import basic_auth, decode_cursor, encode_cursor, make_app

from .conftest import (
    CHANNEL,
    T0,
    csrf_token,
    put,
    put_waiting,
    run_job,
    served_by_waitress,
    text,
    two_step_job,
)

HOSTILE_CATEGORY = "<script>window.pwned=1</script>"
HOSTILE_ERROR = 'Boom: "><img src=x onerror=alert(1)>'


def anonymous_actions() -> Client:
    return Client(make_app(allow_anonymous_actions=True))


def ids_on(page: str) -> list[str]:
    """The job ids of a list page, in order."""
    return re.findall(r'<td class="id"><a href="/jobs/([^"]+)">', page)


# -- the jobs list ----------------------------------------------------------------------------


def fill(store: IJobStore) -> None:
    put(store, "a-done", 0, status=Status.COMPLETED, category="etl")
    put(store, "b-failed", 1, status=Status.FAILED, category="etl", error="ValueError: x")
    put(store, "c-failed", 2, status=Status.FAILED, category="report", channel_id="other")
    put(store, "d-sched", 3, status=Status.SCHEDULED, category="report")
    put(store, "e-running", 4, status=Status.IN_PROGRESS, category="etl", lease_owner="w-1")


def test_the_list_is_newest_first_with_counts_per_status(store: IJobStore) -> None:
    fill(store)
    page = text(Client(make_app()).get("/"))
    assert ids_on(page) == ["e-running", "d-sched", "c-failed", "b-failed", "a-done"]
    assert '<span class="count">5</span> all' in page
    assert re.search(r'<span class="count">2</span> Failed', page)
    assert re.search(r'<span class="count">1</span> Completed', page)
    assert re.search(r'<span class="count">0</span> Cancelled', page)
    assert "ValueError: x" in page


def test_filters_by_status_channel_and_category(store: IJobStore) -> None:
    fill(store)
    client = Client(make_app())
    assert ids_on(text(client.get("/?status=Failed"))) == ["c-failed", "b-failed"]
    assert ids_on(text(client.get("/?channel=other"))) == ["c-failed"]
    assert ids_on(text(client.get("/?category=etl"))) == ["e-running", "b-failed", "a-done"]
    both = text(client.get("/?status=Failed&category=etl"))
    assert ids_on(both) == ["b-failed"]
    # The counts follow the channel and category filters.
    assert re.search(r'<span class="count">3</span> all', text(client.get("/?category=etl")))


def test_filters_with_sql_metacharacters_or_nul_match_nothing(store: IJobStore) -> None:
    fill(store)
    client = Client(make_app())
    for value in ("' OR '1'='1", "etl'; DROP TABLE pypepper_jobs; --", "%", "_", "e\x00tl"):
        for name in ("channel", "category"):
            response = client.get("/", query_string={name: value})
            assert response.status_code == 200, value
            assert ids_on(text(response)) == [] and "No stored job matches" in text(response)
    assert len(store.list()) == 5


def test_bad_filters_are_a_400_page(store: IJobStore) -> None:
    client = Client(make_app())
    for query in ("status=Bogus", "before=not-a-cursor", "limit=0", "limit=501", "limit=x"):
        response = client.get(f"/?{query}")
        assert response.status_code == 400, query
        assert "Bad request" in text(response)


def test_cursor_pages_walk_every_job_once_newest_first(store: IJobStore) -> None:
    for i in range(7):
        put(store, f"job-{i}", i, status=Status.COMPLETED)
    # Two rows created at the same instant: the id breaks the tie.
    put(store, "job-6b", 6, status=Status.COMPLETED)
    client = Client(make_app())
    seen: list[str] = []
    url = "/?limit=3"
    pages = 0
    while url:
        page = text(client.get(html.unescape(url)))
        pages += 1
        seen += ids_on(page)
        older = re.search(r'<a rel="next" href="([^"]+)">Older', page)
        url = older.group(1) if older else ""
        if pages > 1:
            assert "Newest</a>" in page
    assert pages == 3
    assert seen == ["job-6b", "job-6", "job-5", "job-4", "job-3", "job-2", "job-1", "job-0"]


def test_the_cursor_is_the_shells(store: IJobStore) -> None:
    when = datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=timezone.utc)
    cursor = encode_cursor(when, "job/1")
    assert cursor == cli_encode_cursor(when, "job/1")
    assert decode_cursor(cursor) == cli_decode_cursor(cursor) == (when, "job/1")
    naive = base64.urlsafe_b64encode(b"2031-05-06T07:08:09|x").decode()
    assert decode_cursor(naive) is None and decode_cursor("%%%") is None
    put(store, "old", 0)
    put(store, "new", 5)
    page = text(
        Client(make_app()).get(f"/?before={encode_cursor(T0 + timedelta(seconds=5), 'new')}")
    )
    assert ids_on(page) == ["old"]


# -- one job ----------------------------------------------------------------------------------


def test_a_job_shows_its_tasks_every_attempt_and_its_results(store: IJobStore) -> None:
    job_id = run_job(two_step_job())
    record = store.get(job_id)
    assert record is not None and record.status is Status.COMPLETED
    page = text(Client(make_app()).get(f"/jobs/{job_id}"))
    assert 'id="job-status">Completed<' in page
    assert "2 of 2 tasks done" in page
    assert ">fetch<" in page and ">load<" in page
    # Both attempts of fetch: the failed one with its error and traceback, then success.
    assert "2 attempts recorded" in page and "1 attempt recorded" in page
    assert "ValueError: first try fails: &lt;b&gt;not bold&lt;/b&gt;" in page
    assert "<summary>traceback</summary>" in page and "Traceback (most recent call last)" in page
    assert page.count('outcome-failed">failed<') == 1
    assert page.count('outcome-succeeded">succeeded<') == 2
    worker = record.state["history"]["0.0"][0]["worker"]
    assert worker and html.escape(worker) in page
    # The long result: a short form, the whole in a <details>; the small one inline.
    assert '<details class="result"><summary><code>{&#34;note&#34;: &#34;nnn' in page
    assert "n" * 300 in page
    assert "<code>3</code>" in page
    assert "Raw record (JSON)" in page and f"&#34;id&#34;: &#34;{job_id}&#34;" in page


def test_a_scheduled_job_shows_what_it_waits_for_and_its_parents(store: IJobStore) -> None:
    put(store, "parent-1", 0, status=Status.COMPLETED)
    put(store, "parent-2", 1, status=Status.IN_PROGRESS, lease_owner="host:42:abc")
    start = datetime(2040, 1, 1, tzinfo=timezone.utc)
    put_waiting(
        store,
        "child",
        2,
        ["parent-1", "parent-2", "gone"],
        gone=["gone"],
        not_before=start,
        waits={"on_parent_failure": "cancel"},
    )
    client = Client(make_app())
    page = text(client.get("/jobs/child"))
    assert "Waits for" in page
    assert "its planned start at 2040-01-01T00:00:00+00:00" in page
    assert "parents parent-1, parent-2, gone (on failure: cancel)" in page
    assert '<a href="/jobs/parent-1">parent-1</a> (parent)' in page
    assert 'status-completed">Completed<' in page and 'status-inprogress">InProgress<' in page
    assert "no longer stored" in page  # "gone"
    assert "2040-01-01 00:00:00Z" in page  # the planned start among the facts
    running = text(client.get("/jobs/parent-2"))
    assert "<dt>Lease owner</dt><dd>host:42:abc</dd>" in running


def test_an_unknown_job_is_a_404_page(store: IJobStore) -> None:
    client = Client(make_app())
    for job_id in ("nope", "x" * 65, "a/b"):
        response = client.get(f"/jobs/{job_id}")
        assert response.status_code == 404
        assert "Not found" in text(response) and "is stored" in text(response)
    assert client.get("/no/such/page").status_code == 404


def test_hostile_categories_and_errors_are_shown_as_text(store: IJobStore) -> None:
    put(store, "evil", 0, status=Status.FAILED, category=HOSTILE_CATEGORY, error=HOSTILE_ERROR)
    put_waiting(store, "evil-waits", 1, ['"><script>x'], gone=['"><script>x'])
    client = Client(make_app())
    for path in ("/", "/jobs/evil", "/?category=" + HOSTILE_CATEGORY, "/jobs/evil-waits"):
        page = text(client.get(path))
        assert "<script>window" not in page and "<img src=x" not in page
        assert '"><script>x' not in page
    listing = text(client.get("/"))
    assert html.escape(HOSTILE_CATEGORY, quote=False) in listing
    detail = text(client.get("/jobs/evil"))
    assert "&lt;img src=x onerror=alert(1)&gt;" in detail
    response = client.get("/")
    assert "script-src 'self'" in response.headers["Content-Security-Policy"]
    assert response.headers["X-Frame-Options"] == "DENY"


# -- actions: CSRF, read-only, access ----------------------------------------------------------


def cancellable(store: IJobStore, job_id: str = "to-cancel") -> str:
    put(store, job_id, 0, status=Status.SCHEDULED)
    return job_id


def test_cancel_with_a_good_token_cancels_the_job(store: IJobStore) -> None:
    job_id = cancellable(store)
    client = anonymous_actions()
    token = csrf_token(client, f"/actions/cancel/{job_id}")  # the confirmation page
    response = client.post(f"/actions/cancel/{job_id}", data={"csrf_token": token})
    assert response.status_code == 303
    assert response.headers["Location"].endswith(f"/jobs/{job_id}?notice=cancelled")
    record = store.get(job_id)
    assert record is not None and record.status is Status.CANCELLED
    page = text(client.get(response.headers["Location"]))
    assert "The job was cancelled." in page and 'id="job-status">Cancelled<' in page
    assert "Cancel job" not in page
    # Again: a cancelled job has ended, as a completed one.
    again = client.post(f"/actions/cancel/{job_id}", data={"csrf_token": token})
    assert again.status_code == 303 and again.headers["Location"].endswith("notice=ended")
    # A job that ended otherwise is left as it is.
    put(store, "done", 1, status=Status.COMPLETED)
    ended = client.post("/actions/cancel/done", data={"csrf_token": token})
    assert ended.status_code == 303 and ended.headers["Location"].endswith("notice=ended")
    assert "had already ended" in text(client.get(ended.headers["Location"]))
    assert client.post("/actions/cancel/nope", data={"csrf_token": token}).status_code == 404


def test_an_action_without_a_good_csrf_token_is_refused_and_changes_nothing(
    store: IJobStore,
) -> None:
    job_id = cancellable(store)
    client = anonymous_actions()
    token = csrf_token(client, f"/actions/cancel/{job_id}")
    other_app = Client(make_app(allow_anonymous_actions=True, secret_key="another key"))
    foreign = csrf_token(other_app, f"/actions/cancel/{job_id}")
    for data in ({}, {"csrf_token": ""}, {"csrf_token": token + "x"}, {"csrf_token": foreign}):
        response = client.post(f"/actions/cancel/{job_id}", data=data)
        assert response.status_code == 403, data
        assert "CSRF token" in text(response)
    # A good token without the browser's cookie (another browser, a cross-site form).
    fresh = anonymous_actions()
    assert fresh.post(f"/actions/cancel/{job_id}", data={"csrf_token": token}).status_code == 403
    assert client.get(f"/actions/cancel/{job_id}").status_code == 200  # only asks
    record = store.get(job_id)
    assert record is not None and record.status is Status.SCHEDULED


def test_without_auth_the_dashboard_is_read_only(store: IJobStore) -> None:
    job_id = cancellable(store)
    app = make_app()
    client = Client(app)
    page = text(client.get(f"/jobs/{job_id}"))
    assert "Read-only: no authentication is configured" in page
    assert "Cancel job" not in page and 'name="csrf_token"' not in page
    # Even with a token signed by the same key, the action is refused.
    cookie = client.get_cookie("pypepper_dashboard_csrf")
    assert cookie is not None
    token = app._csrf.token(cookie.value)
    response = client.post(f"/actions/cancel/{job_id}", data={"csrf_token": token})
    assert response.status_code == 403 and "read-only" in text(response)
    record = store.get(job_id)
    assert record is not None and record.status is Status.SCHEDULED
    assert "anyone who reaches" in text(anonymous_actions().get("/"))


def test_an_auth_callable_decides_each_request(store: IJobStore) -> None:
    job_id = cancellable(store)
    seen: list[str] = []

    def auth(environ: Any) -> bool:
        seen.append(environ["PATH_INFO"])
        return bool(environ.get("HTTP_X_TEAM") == "ops")

    client = Client(make_app(auth=auth))
    refused = client.get("/")
    assert refused.status_code == 401 and "Basic" in refused.headers["WWW-Authenticate"]
    assert client.get("/static/dashboard.css").status_code == 401
    headers = {"X-Team": "ops"}
    page = client.get(f"/jobs/{job_id}", headers=headers)
    assert page.status_code == 200 and "Read-only" not in text(page)
    page = client.get(f"/actions/cancel/{job_id}", headers=headers)
    token = re.search(r'name="csrf_token" value="([^"]+)"', text(page))
    assert token is not None
    data = {"csrf_token": token.group(1)}
    assert client.post(f"/actions/cancel/{job_id}", data=data).status_code == 401
    response = client.post(f"/actions/cancel/{job_id}", data=data, headers=headers)
    assert response.status_code == 303
    record = store.get(job_id)
    assert record is not None and record.status is Status.CANCELLED
    assert seen[:2] == ["/", "/static/dashboard.css"]


def basic(user: str, password: str) -> dict[str, str]:
    pair = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {pair}"}


def test_basic_auth_lets_in_only_its_user(store: IJobStore) -> None:
    fill(store)
    client = Client(make_app(auth=basic_auth("ops", "s3cret pass")))
    assert client.get("/").status_code == 401
    assert client.get("/", headers=basic("ops", "wrong")).status_code == 401
    assert client.get("/", headers=basic("other", "s3cret pass")).status_code == 401
    assert client.get("/", headers={"Authorization": "Bearer s3cret"}).status_code == 401
    assert client.get("/", headers=basic("ops", "s3cret pass")).status_code == 200
    with pytest.raises(ValueError):
        basic_auth("", "x")
    with pytest.raises(TypeError):
        make_app(auth="ops:s3cret")  # type: ignore[arg-type]


def test_actions_on_a_store_that_is_not_the_processs_are_refused(store: IJobStore) -> None:
    other = MemoryJobStore()
    put(other, "elsewhere", 0, status=Status.SCHEDULED)
    client = Client(make_app(other, allow_anonymous_actions=True))
    token = csrf_token(client, "/actions/cancel/elsewhere")
    response = client.post("/actions/cancel/elsewhere", data={"csrf_token": token})
    assert response.status_code == 409
    record = other.get("elsewhere")
    assert record is not None and record.status is Status.SCHEDULED


# -- schedules and channels --------------------------------------------------------------------


def stored_schedule(store: IJobStore, name: str = "nightly <report>") -> RecurringSchedule:
    template = two_step_job("nightly").to_record()
    return store.save_recurring(
        RecurringSchedule(
            name=name,
            cron="0 6 * * *",
            timezone="Europe/Paris",
            template={"channel_id": CHANNEL, "category": "nightly", "payload": template.payload},
            next_slot=datetime(2030, 1, 1, 5, 0, tzinfo=timezone.utc),
        )
    )


def test_schedules_are_listed_paused_resumed_and_triggered(store: IJobStore) -> None:
    name = stored_schedule(store).name
    client = anonymous_actions()
    page = text(client.get("/schedules"))
    assert "nightly &lt;report&gt;" in page and "0 6 * * *" in page and "Europe/Paris" in page
    assert "2030-01-01 05:00:00Z" in page
    token = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert token is not None
    data = {"csrf_token": token.group(1)}
    quoted = "nightly%20%3Creport%3E"
    assert f'action="/actions/pause/{quoted}"' in page

    paused = client.post(f"/actions/pause/{quoted}", data=data)
    assert paused.status_code == 303 and paused.headers["Location"].endswith("notice=paused")
    schedule = store.get_recurring(name)
    assert schedule is not None and schedule.paused
    page = text(client.get("/schedules?notice=paused"))
    assert "The schedule is paused." in page and 'class="badge paused"' in page
    assert f'action="/actions/resume/{quoted}"' in page

    resumed = client.post(f"/actions/resume/{quoted}", data=data)
    assert resumed.status_code == 303
    schedule = store.get_recurring(name)
    assert schedule is not None and not schedule.paused
    assert schedule.next_slot > datetime.now(timezone.utc)  # the missed slots are skipped

    fired = client.post(f"/actions/trigger/{quoted}", data=data)
    assert fired.status_code == 303 and "notice=triggered" in fired.headers["Location"]
    job_id = fired.headers["Location"].split("/jobs/", 1)[1].split("?", 1)[0]
    record = store.get(job_id)
    assert record is not None and record.category == "nightly"
    assert record.status is Status.SCHEDULED

    assert client.post("/actions/pause/missing", data=data).status_code == 404
    assert client.post("/actions/trigger/missing", data=data).status_code == 404
    assert client.post(f"/actions/pause/{quoted}", data={}).status_code == 403


def test_pause_and_resume_recurring(store: IJobStore) -> None:
    name = stored_schedule(store, "plain").name
    assert pause_recurring(name) and pause_recurring(name)
    schedule = store.get_recurring(name)
    assert schedule is not None and schedule.paused
    assert store.due_recurring(datetime(2031, 1, 1, tzinfo=timezone.utc)) == []
    now = datetime(2031, 3, 1, 12, 0, tzinfo=timezone.utc)
    assert resume_recurring(name, now=now)
    schedule = store.get_recurring(name)
    assert schedule is not None and not schedule.paused
    assert schedule.next_slot == datetime(2031, 3, 2, 5, 0, tzinfo=timezone.utc)  # 6:00 Paris


def test_the_channels_page_shows_this_processs_channels(store: IJobStore) -> None:
    from pypepper_dramatiq import manager

    manager.new("bounded <ch>", maxsize=5)
    stopped = manager.new("stopped-ch")
    stopped.request_stop()
    manager.new("limited-ch", rate_limit="50/s")
    page = text(Client(make_app()).get("/channels"))
    assert "As kept in this process." in page
    assert "bounded &lt;ch&gt;" in page and "<td>5</td>" in page
    assert "stopped-ch" in page and ">stopped<" in page and "unbounded" in page
    row = page.split(">limited-ch</a>", 1)[1].split("</tr>", 1)[0]
    assert "<td>50/s</td>" in row
    row = page.split(">stopped-ch</a>", 1)[1].split("</tr>", 1)[0]
    assert "<td>-</td>" in row  # no rate limit


def test_the_channels_page_shows_a_concurrency_limit_and_the_slots_held(
    store: IJobStore,
) -> None:
    from pypepper_dramatiq import manager
    from pypepper_dramatiq.channels.broker import get_broker, transport_of
    from pypepper_dramatiq.transport.base import channel_slot_key

    manager.new("reports-ch", max_running=2)
    manager.new("free-ch")
    transport = transport_of(get_broker())
    assert transport.acquire_slots([(channel_slot_key("reports-ch"), 2)], "a-step", 60.0)
    try:
        page = text(Client(make_app()).get("/channels"))
    finally:
        transport.release_slots([channel_slot_key("reports-ch")], "a-step")
    assert "<th>Running (limit)</th>" in page
    row = page.split(">reports-ch</a>", 1)[1].split("</tr>", 1)[0]
    assert '<td class="running">1 of 2</td>' in row
    row = page.split(">free-ch</a>", 1)[1].split("</tr>", 1)[0]
    assert '<td class="running">-</td>' in row  # no limit: nothing read


def test_counts_by_status_of_each_store(store: IJobStore) -> None:
    fill(store)
    counts = store.count_by_status()
    assert counts[Status.FAILED] == 2 and counts[Status.COMPLETED] == 1
    assert counts[Status.CANCELLED] == 0 and set(counts) == set(Status)
    assert store.count_by_status(JobFilter(channel_id="other")) == {
        **dict.fromkeys(Status, 0),
        Status.FAILED: 1,
    }
    assert store.count_by_status(JobFilter(category="etl"))[Status.IN_PROGRESS] == 1
    assert (
        sum(store.count_by_status(JobFilter(channel_id=CHANNEL, category="report")).values()) == 1
    )


# -- mounting and the shell ----------------------------------------------------------------------


def test_mounted_under_a_prefix_in_flask(store: IJobStore) -> None:
    flask = pytest.importorskip("flask")
    from werkzeug.middleware.dispatcher import DispatcherMiddleware

    job_id = cancellable(store)
    site = flask.Flask("site")

    @site.get("/")
    def home() -> str:
        return "the site"

    site.wsgi_app = DispatcherMiddleware(  # type: ignore[method-assign]
        site.wsgi_app, {"/ops/jobs": make_app(allow_anonymous_actions=True)}
    )
    client = site.test_client()
    assert client.get("/").get_data(as_text=True) == "the site"
    page = client.get("/ops/jobs/")
    assert page.status_code == 200
    body = page.get_data(as_text=True)
    assert 'href="/ops/jobs/static/dashboard.css"' in body
    assert f'href="/ops/jobs/jobs/{job_id}"' in body
    assert "Path=/ops/jobs/" in page.headers["Set-Cookie"]
    detail = client.get(f"/ops/jobs/jobs/{job_id}").get_data(as_text=True)
    assert f'action="/ops/jobs/actions/cancel/{job_id}"' in detail
    confirm = client.get(f"/ops/jobs/actions/cancel/{job_id}").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', confirm)
    assert token is not None and f'action="/ops/jobs/actions/cancel/{job_id}"' in confirm
    response = client.post(f"/ops/jobs/actions/cancel/{job_id}", data={"csrf_token": token[1]})
    assert response.status_code == 303
    assert response.headers["Location"].endswith(f"/ops/jobs/jobs/{job_id}?notice=cancelled")
    css = client.get("/ops/jobs/static/dashboard.css")
    assert css.status_code == 200 and "text/css" in css.headers["Content-Type"]
    css.close()


def test_the_dashboard_command_serves_with_basic_auth_from_the_environment(
    store: IJobStore, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pypepper_dramatiq import stores

    made = served_by_waitress(monkeypatch)
    # The command opens the store from --uri: let it open this one.
    monkeypatch.setattr("pypepper_dramatiq.stores.sql.SqlJobStore", lambda uri: store)
    monkeypatch.setattr(stores.base.IJobStore, "close", lambda self: None)
    put(store, "shown", 0, status=Status.SCHEDULED)

    monkeypatch.setenv("PYPEPPER_DASHBOARD_USER", "ops")
    monkeypatch.delenv("PYPEPPER_DASHBOARD_PASSWORD", raising=False)
    assert main(["dashboard", "--uri", "postgresql+psycopg://unused/db"]) == 2
    assert "both" in capsys.readouterr().err

    monkeypatch.setenv("PYPEPPER_DASHBOARD_PASSWORD", "pw")
    assert main(["dashboard", "--uri", "postgresql+psycopg://unused/db", "--port", "9999"]) == 0
    host, port, app = made[-1].host, made[-1].port, made[-1].app
    assert (host, port) == ("127.0.0.1", 9999)
    set_job_store(store)  # the command forgets its store when its server stops
    assert "basic auth" in capsys.readouterr().err
    client = Client(app)
    assert client.get("/jobs/shown").status_code == 401
    assert client.get("/jobs/shown", headers=basic("ops", "pw")).status_code == 200

    monkeypatch.delenv("PYPEPPER_DASHBOARD_USER")
    monkeypatch.delenv("PYPEPPER_DASHBOARD_PASSWORD")
    assert main(["dashboard", "--uri", "x://y", "--host", "0.0.0.0"]) == 0
    host, app = made[-1].host, made[-1].app
    set_job_store(store)
    assert host == "0.0.0.0" and "read-only" in capsys.readouterr().err
    assert "Read-only" in text(Client(app).get("/"))


def test_the_dashboard_is_importable_by_the_name_users_look_for() -> None:
    from pypepper_dramatiq import dashboard, web

    assert dashboard.make_app is web.make_app and dashboard.basic_auth is web.basic_auth


def test_the_cancel_button_asks_for_a_confirmation_without_javascript(store: IJobStore) -> None:
    job_id = cancellable(store)
    client = Client(make_app(auth=basic_auth("ops", "pw")))
    auth = basic("ops", "pw")
    page = text(client.get(f"/jobs/{job_id}", headers=auth))
    # The job's page: a plain GET form to the confirmation page, no token in a URL.
    button = re.search(r'<form method="get" action="([^"]+)"[^>]*>\s*<button', page)
    assert button is not None and button.group(1) == f"/actions/cancel/{job_id}"
    confirm = client.get(button.group(1), headers=auth)
    assert confirm.status_code == 200
    asked = text(confirm)
    assert "Cancel job" in asked and "Yes, cancel the job" in asked
    assert f'<form method="post" action="/actions/cancel/{job_id}"' in asked
    record = store.get(job_id)
    assert record is not None and record.status is Status.SCHEDULED  # asking changed nothing
    token = re.search(r'name="csrf_token" value="([^"]+)"', asked)
    assert token is not None
    done = client.post(f"/actions/cancel/{job_id}", data={"csrf_token": token[1]}, headers=auth)
    assert done.status_code == 303 and done.headers["Location"].endswith("notice=cancelled")
    record = store.get(job_id)
    assert record is not None and record.status is Status.CANCELLED
    assert record.state["cancelled_by"]["by"] == "dashboard:ops"
    host = record.state["cancelled_by"]["host"]
    shown = text(client.get(f"/jobs/{job_id}", headers=auth))
    assert f"by dashboard:ops on {host}" in shown  # in the facts and the timeline
    # The confirmation page of a job that ended sends back to its page.
    again = client.get(f"/actions/cancel/{job_id}", headers=auth)
    assert again.status_code == 303 and again.headers["Location"].endswith("notice=ended")
    assert client.get("/actions/cancel/nope", headers=auth).status_code == 404


def test_a_read_only_dashboard_offers_no_confirmation_page(store: IJobStore) -> None:
    job_id = cancellable(store)
    response = Client(make_app()).get(f"/actions/cancel/{job_id}")
    assert response.status_code == 403 and "read-only" in text(response)
