"""The dashboard against poison input: text no store keeps in a path, a query or a
cursor; ids and names with slashes; Werkzeug's redirects; hostile and huge text;
long lists; ``auth`` answers; foreign origins; a secret shared by several processes."""

from __future__ import annotations

import base64
import html
import re
import unicodedata
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from werkzeug.middleware.dispatcher import DispatcherMiddleware
from werkzeug.test import Client

from pypepper_dramatiq.cli.commands import main
from pypepper_dramatiq.records.paging import decode_cursor
from pypepper_dramatiq.records.record import JobRecord
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import IJobStore
from pypepper_dramatiq.stores.registry import set_job_store
from pypepper_dramatiq.web import make_app, views

from .conftest import csrf_token, put, served_by_waitress, text
from .test_dashboard import anonymous_actions, basic, stored_schedule

NUL = "a\x00b"


def raw_cursor(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


# -- text no store keeps ----------------------------------------------------------------------


def test_a_nul_in_a_path_query_or_cursor_is_a_400_or_404_never_a_store_error(
    store: IJobStore,
) -> None:
    put(store, "plain", 0, status=Status.SCHEDULED)
    stored_schedule(store, "nightly")
    client = anonymous_actions()
    token = csrf_token(client, "/schedules")
    assert client.get("/jobs/a%00b").status_code == 404
    for action in ("cancel", "retry", "pause", "resume", "trigger"):
        response = client.post(f"/actions/{action}/a%00b", data={"csrf_token": token})
        assert response.status_code == 404, action
        assert "is stored" in text(response)
    bad_cursor = raw_cursor(f"2030-01-01T12:00:00+00:00|{NUL}")
    response = client.get(f"/?before={bad_cursor}")
    assert response.status_code == 400 and "cursor" in text(response)
    for query in ("created_from=2030-01-01%00", "limit=5%00"):
        assert client.get(f"/?{query}").status_code == 400, query
    for name in ("channel", "category", "q"):
        response = client.get("/", query_string={name: NUL})
        assert response.status_code == 200 and "No stored job matches" in text(response)
    record = store.get("plain")
    assert record is not None and record.status is Status.SCHEDULED


def test_a_cursor_naming_an_id_no_store_keeps_is_no_cursor() -> None:
    assert decode_cursor(raw_cursor(f"2030-01-01T12:00:00+00:00|{NUL}")) is None
    assert decode_cursor(raw_cursor("2030-01-01T12:00:00+00:00|ok")) is not None


# -- slashes and redirects --------------------------------------------------------------------


def test_ids_and_schedule_names_with_slashes_are_reachable(store: IJobStore) -> None:
    odd = ["/x", "a//b", "x/", "/", "//"]
    for n, job_id in enumerate(odd):
        put(store, job_id, n, status=Status.SCHEDULED)
    client = anonymous_actions()
    listing = text(client.get("/"))
    links = [html.unescape(h) for h in re.findall(r'<td class="id"><a href="([^"]+)">', listing)]
    assert sorted(links) == sorted(f"/jobs/{job_id}" for job_id in odd)
    for link in links:
        page = client.get(link)
        assert page.status_code == 200, link
        shown = re.search(r'<span class="id">(.*?)</span>', text(page))
        assert shown is not None and f"/jobs/{html.unescape(shown.group(1))}" == link
    token = csrf_token(client, "/actions/cancel/x/")
    cancelled = client.post("/actions/cancel/x/", data={"csrf_token": token})
    assert cancelled.status_code == 303
    assert cancelled.headers["Location"].endswith("/jobs/x/?notice=cancelled")
    record = store.get("x/")
    assert record is not None and record.status is Status.CANCELLED
    assert store.get("/x").status is Status.SCHEDULED  # type: ignore[union-attr]

    stored_schedule(store, "ops/nightly")
    name = stored_schedule(store, "/ops/nightly").name
    page = text(client.get("/schedules"))
    assert 'action="/actions/pause//ops/nightly"' in page
    paused = client.post("/actions/pause//ops/nightly", data={"csrf_token": token})
    assert paused.status_code == 303
    assert store.get_recurring(name).paused  # type: ignore[union-attr]
    assert not store.get_recurring("ops/nightly").paused  # type: ignore[union-attr]


def test_werkzeug_redirects_are_answered_as_redirects(store: IJobStore) -> None:
    client = Client(make_app())
    response = client.get("/jobs?status=Failed")
    assert response.status_code == 308
    assert response.headers["Location"] == "http://localhost/?status=Failed"
    assert response.headers["X-Frame-Options"] == "DENY"
    assert client.get("/jobs?status=Failed", follow_redirects=True).status_code == 200
    mounted = Client(DispatcherMiddleware(make_app(), {"/ops": make_app()}))
    response = mounted.get("/ops/jobs")
    assert response.status_code == 308 and response.headers["Location"] == "http://localhost/ops/"


# -- who may: auth answers, origins, a shared secret ------------------------------------------


def test_only_an_auth_answer_of_true_lets_a_request_in(store: IJobStore) -> None:
    put(store, "shown", 0, status=Status.SCHEDULED)
    for answer in (1, "ops", ["yes"], {"user": "ops"}, object(), None, False, 0):
        client = Client(make_app(auth=lambda environ, answer=answer: answer))
        assert client.get("/jobs/shown").status_code == 401, answer
        assert client.post("/actions/cancel/shown").status_code == 401, answer
    assert Client(make_app(auth=lambda environ: True)).get("/jobs/shown").status_code == 200
    record = store.get("shown")
    assert record is not None and record.status is Status.SCHEDULED


def test_a_post_from_another_sites_page_is_refused_even_with_a_good_token(
    store: IJobStore,
) -> None:
    put(store, "to-cancel", 0, status=Status.SCHEDULED)
    client = anonymous_actions()
    data = {"csrf_token": csrf_token(client, "/actions/cancel/to-cancel")}
    foreign = (
        {"Origin": "http://evil.example"},
        {"Origin": "http://localhost.evil.example"},
        {"Origin": "http://localhost:8081"},
        {"Origin": "null"},
        {"Origin": "file://"},
        {"Origin": "http://localhost:x"},
        {"Referer": "http://evil.example/jobs/to-cancel"},
        # The Origin decides, whatever the Referer says.
        {"Origin": "http://evil.example", "Referer": "http://localhost/jobs/to-cancel"},
    )
    for headers in foreign:
        response = client.post("/actions/cancel/to-cancel", data=data, headers=headers)
        assert response.status_code == 403, headers
        assert "another site" in text(response)
    record = store.get("to-cancel")
    assert record is not None and record.status is Status.SCHEDULED
    own = (
        {"Origin": "http://localhost"},
        {"Origin": "https://LOCALHOST:443"},  # a proxy ending TLS: the scheme is not compared
        {"Referer": "http://localhost/jobs/to-cancel"},
        # Behind a proxy that names the public host in X-Forwarded-Host.
        {"Origin": "https://ops.example.com", "X-Forwarded-Host": "ops.example.com"},
        {},  # neither header: not a browser's form; the token and cookie decide
    )
    for headers in own:
        response = client.post("/actions/cancel/to-cancel", data=data, headers=headers)
        assert response.status_code == 303, headers


def test_two_dashboards_with_one_secret_take_each_others_forms(store: IJobStore) -> None:
    put(store, "to-cancel", 0, status=Status.SCHEDULED)
    secret = "one secret for every replica"
    first = make_app(allow_anonymous_actions=True, secret_key=secret)
    second = make_app(allow_anonymous_actions=True, secret_key=secret)
    other = make_app(allow_anonymous_actions=True)  # a random secret of its own
    browser = Client(first)
    token = csrf_token(browser, "/actions/cancel/to-cancel")
    cookie = browser.get_cookie("pypepper_dashboard_csrf")
    assert cookie is not None

    def post_to(app: object) -> int:
        client = Client(app)  # the same browser: its cookie, another process
        client.set_cookie("pypepper_dashboard_csrf", cookie.value)
        return client.post("/actions/cancel/to-cancel", data={"csrf_token": token}).status_code

    assert post_to(other) == 403
    assert store.get("to-cancel").status is Status.SCHEDULED  # type: ignore[union-attr]
    assert post_to(second) == 303
    assert store.get("to-cancel").status is Status.CANCELLED  # type: ignore[union-attr]


def served_by_the_command(
    argv: list[str], store: IJobStore, monkeypatch: pytest.MonkeyPatch
) -> tuple[int, Any]:
    """What ``pypepper-dramatiq dashboard ARGV`` serves (its exit status, its app)."""
    from pypepper_dramatiq import stores

    made = served_by_waitress(monkeypatch)
    monkeypatch.setattr("pypepper_dramatiq.stores.sql.SqlJobStore", lambda uri: store)
    monkeypatch.setattr(stores.base.IJobStore, "close", lambda self: None)
    monkeypatch.setenv("PYPEPPER_DASHBOARD_USER", "ops")
    monkeypatch.setenv("PYPEPPER_DASHBOARD_PASSWORD", "pw")
    status = main(["dashboard", "--uri", "postgresql+psycopg://unused/db", *argv])
    set_job_store(store)  # the command forgets its store when its server stops
    return status, made[-1].app if made else None


def test_the_command_takes_the_secret_from_a_file_or_the_environment(
    store: IJobStore,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    put(store, "to-cancel", 0, status=Status.SCHEDULED)
    key_file = tmp_path / "dashboard.key"
    key_file.write_text("a secret read from a file\n")
    monkeypatch.delenv("PYPEPPER_DASHBOARD_SECRET_KEY", raising=False)
    _, from_file = served_by_the_command(["--secret-key-file", str(key_file)], store, monkeypatch)
    assert "a shared form secret" in capsys.readouterr().err
    monkeypatch.setenv("PYPEPPER_DASHBOARD_SECRET_KEY", "  a secret read from a file ")
    _, from_env = served_by_the_command([], store, monkeypatch)
    monkeypatch.delenv("PYPEPPER_DASHBOARD_SECRET_KEY")
    _, random = served_by_the_command([], store, monkeypatch)
    assert "a form secret of its own" in capsys.readouterr().err

    auth = basic("ops", "pw")
    browser = Client(from_file)
    page = text(browser.get("/actions/cancel/to-cancel", headers=auth))
    found = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert found is not None
    cookie = browser.get_cookie("pypepper_dashboard_csrf")
    assert cookie is not None

    def post_to(app: Any) -> int:
        client = Client(app)
        client.set_cookie("pypepper_dashboard_csrf", cookie.value)
        data = {"csrf_token": found.group(1)}
        return client.post("/actions/cancel/to-cancel", data=data, headers=auth).status_code

    assert post_to(random) == 403
    assert post_to(from_env) == 303
    assert store.get("to-cancel").status is Status.CANCELLED  # type: ignore[union-attr]

    for argv, env in (
        (["--secret-key-file", str(tmp_path / "missing")], None),
        (["--secret-key-file", str(tmp_path / "short")], None),
        ([], "too short"),
    ):
        (tmp_path / "short").write_text("short\n")
        if env is not None:
            monkeypatch.setenv("PYPEPPER_DASHBOARD_SECRET_KEY", env)
        status, app = served_by_the_command(argv, store, monkeypatch)
        assert status == 2 and app is None, argv
        assert "secret" in capsys.readouterr().err


# -- text shown as text -----------------------------------------------------------------------

RLO, ZWSP = "\u202e", "\u200b"


def interpreted(page: str) -> set[str]:
    """The format and control characters of ``page`` (its layout, newlines and tabs, aside)."""
    return {c for c in page if unicodedata.category(c) in ("Cc", "Cf") and c not in "\n\t\r"}


def test_bidi_controls_and_zero_width_characters_are_shown_visibly(store: IJobStore) -> None:
    spoof = f"admin{RLO}gpj.exe{ZWSP}"
    history = {
        "0.0": [
            {
                "round": 0,
                "attempt": 0,
                "outcome": "failed",
                "worker": f"host{RLO}1",
                "error_type": "ValueError",
                "message": f"bad{ZWSP}",
                "traceback": f"Traceback (most recent call last):\n\tline {RLO}1\nValueError",
            }
        ]
    }
    put(
        store,
        f"job{RLO}1",
        0,
        status=Status.FAILED,
        category=spoof,
        error=f"first line\n\tsecond{RLO} line",
        state={"history": history, "errors": {"0.0": f"bad{ZWSP}"}},
    )
    stored_schedule(store, f"nightly{RLO}")
    client = Client(make_app(allow_anonymous_actions=True))
    listing = text(client.get("/"))
    job_page = text(client.get(f"/jobs/job{RLO}1"))
    schedules = text(client.get("/schedules"))
    for page in (listing, job_page, schedules):
        assert interpreted(page) == set()
    assert r"admin\u202egpj.exe\u200b" in listing and r"job\u202e1" in listing
    assert f'href="/jobs/job{quote(RLO)}1"' in listing  # the link still leads to the job
    assert r"<title>Job job\u202e1 · pypepper-dramatiq</title>" in job_page
    assert r'<bdi class="id">job\u202e1</bdi>' in job_page
    # Blocks keep their lines and tabs; everything else is escaped visibly.
    assert '<pre class="error-text">first line\n\tsecond\\u202e line</pre>' in job_page
    assert "Traceback (most recent call last):\n\tline \\u202e1\nValueError</pre>" in job_page
    assert r"host\u202e1" in job_page and r"ValueError: bad\u200b" in job_page
    assert r"nightly\u202e" in schedules
    assert f'action="/actions/pause/nightly{quote(RLO)}"' in schedules
    # A filter's field keeps what was typed, so that sending it again is the same filter.
    filtered = text(client.get("/", query_string={"category": spoof}))
    assert f'name="category" value="{spoof}"' in filtered
    assert r"admin\u202egpj.exe\u200b" in filtered  # the row found, shown escaped


# -- long lists -------------------------------------------------------------------------------


def linked_ids(page: str, kind: str) -> list[str]:
    """The job ids a list of linked jobs (``parents`` or ``children``) links to, in order."""
    found = re.search(rf'<[ou]l class="related {kind}"[^>]*>(.*?)</[ou]l>', page, re.S)
    assert found is not None, f"no list of {kind}"
    return [html.unescape(i) for i in re.findall(r'<a href="/jobs/([^"]+)">', found.group(1))]


def test_ten_thousand_parents_are_listed_fifty_on_the_job_page_the_rest_in_pages(
    store: IJobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(views, "LINKED_PAGE", 2_500)  # four pages of the rest, not fifty
    parents = [f"p-{n:05d}" for n in range(10_000)]
    for n, parent in enumerate(parents[:3]):
        put(store, parent, n, status=Status.COMPLETED)
    # A waiting row is stored only while its parents are: the rest still run.
    store.put_many([JobRecord(id=p, status=Status.IN_PROGRESS) for p in parents[3:]])
    put(
        store,
        "many",
        10,
        status=Status.SCHEDULED,
        waits={"parents": parents, "on_parent_failure": "cancel"},
    )
    client = Client(make_app())
    response = client.get("/jobs/many")
    page = text(response)
    # Was 1.35 MB; most of what is left is the raw record, cut at 100,000 characters.
    assert len(response.data) < 200_000
    assert linked_ids(page, "parents") == parents[:50]
    assert page.count('status-completed">Completed<') == 3
    more = re.search(r'<p class="more"><a href="([^"]+)">and 9950 more parents</a>', page)
    assert more is not None
    waits = re.search(r'<ul class="waits"><li>(.*?)</li>', page, re.S)
    assert waits is not None and len(html.unescape(waits.group(1))) <= 500
    # The pages of the rest, each after the last, up to the last parent.
    seen, url, pages = parents[:50], html.unescape(more.group(1)), 0
    while url:
        assert url.startswith("/linked/parents/many?start=")
        listing = text(client.get(url))
        pages += 1
        seen += linked_ids(listing, "parents")
        next_page = re.search(r'<a rel="next" href="([^"]+)">More', listing)
        url = html.unescape(next_page.group(1)) if next_page else ""
        assert "First</a>" in listing
    assert seen == parents and pages == 4


def test_children_attempts_and_the_timeline_are_capped_too(store: IJobStore) -> None:
    put(store, "root", 0, status=Status.COMPLETED)
    children = [f"c-{n:02d}" for n in range(60)]
    for n, child in enumerate(children):
        put(store, child, n + 1, status=Status.SCHEDULED, waits={"parents": ["root"]})
    client = Client(make_app())
    page = text(client.get("/jobs/root"))
    assert linked_ids(page, "children") == children[:50]
    more = re.search(r'<p class="more"><a href="([^"]+)">more children</a>', page)
    assert more is not None and html.unescape(more.group(1)) == "/linked/children/root?start=50"
    rest = text(client.get("/linked/children/root?start=50"))
    assert linked_ids(rest, "children") == children[50:] and 'rel="next"' not in rest
    assert 'class="related children" start="51"' in rest
    for bad in ("start=-1", "start=x", "start=1000001"):
        assert client.get(f"/linked/children/root?{bad}").status_code == 400, bad
    assert client.get("/linked/children/missing").status_code == 404
    assert client.get("/linked/other/root").status_code == 404

    attempt = {"round": 0, "outcome": "failed", "started": "2030-01-01T12:00:00+00:00"}
    history = [{**attempt, "attempt": n, "ended": "2030-01-01T12:00:01+00:00"} for n in range(60)]
    put(store, "retried", 70, status=Status.FAILED, state={"history": {"0.0": history}})
    page = text(client.get("/jobs/retried"))
    attempts = re.search(r'<table class="attempts">(.*?)</table>', page, re.S)
    assert attempts is not None and attempts.group(1).count("<tr>") == 1 + 50  # head + rows
    assert "50 attempts recorded, 10 more in the row not shown" in page
    timeline = page[page.index("<h2>Timeline</h2>") :]
    assert timeline.count("<li class=") == 50 + 1 + 50
    assert "22 moments left out" in timeline  # created, 120 attempt moments, the end
