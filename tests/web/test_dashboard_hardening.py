"""The dashboard against poison input: text no store keeps in a path, a query or a
cursor; ids and names with slashes; Werkzeug's redirects; hostile and huge text;
long lists; ``auth`` answers; foreign origins; a secret shared by several processes."""

from __future__ import annotations

import base64
import html
import re

from werkzeug.middleware.dispatcher import DispatcherMiddleware
from werkzeug.test import Client

from pypepper_dramatiq.paging import decode_cursor
from pypepper_dramatiq.status import Status
from pypepper_dramatiq.stores.base import IJobStore
from pypepper_dramatiq.web import make_app

from .conftest import csrf_token, put, text
from .test_dashboard import anonymous_actions, stored_schedule

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
    token = csrf_token(client, "/jobs/x/")
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
