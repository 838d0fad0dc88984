"""The dashboard's workers page, through Werkzeug's test client, on memory and PostgreSQL.

Each worker row (live, or gone after missing its heartbeats) with host, pid, times and
the steps it holds now, linked to their jobs; hostile text stays text; the nav links it.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from werkzeug.test import Client

from pypepper_dramatiq.records.record import utcnow
from pypepper_dramatiq.records.workers import DutyFailure, SweepHealth, WorkerInfo
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import IJobStore
from pypepper_dramatiq.web import make_app

from .conftest import put, text

FAR_FUTURE = datetime(2200, 1, 1, tzinfo=timezone.utc)
PAYLOAD = {"workflows": [{"tasks": [{"name": "fetch"}, {"name": "load"}]}]}


@pytest.fixture
def workers(store: IJobStore) -> Iterator[IJobStore]:
    """Two workers in the process's store: one live running a step, one gone since a
    minute (its step still leased to it)."""
    store.prune_workers(FAR_FUTURE)
    now = utcnow()
    started = now - timedelta(minutes=30)
    store.beat_worker(
        WorkerInfo("alpha:101:aa", "alpha", 101, started, now, channels=("web", "etl"))
    )
    store.beat_worker(
        WorkerInfo("beta:202:bb", "beta", 202, started, now - timedelta(seconds=65), heartbeat=5)
    )
    running = {"status": Status.IN_PROGRESS, "payload": PAYLOAD}
    put(store, "job-run", 0, lease_owner="alpha:101:aa", state={"cursor": [0, 1, 1, 0]}, **running)
    put(store, "job-stuck", 1, lease_owner="beta:202:bb", state={"cursor": [0, 0, 0, 0]}, **running)
    put(store, "job-done", 2, status=Status.COMPLETED)
    yield store
    store.prune_workers(FAR_FUTURE)


def rows_of(page: str) -> list[str]:
    return re.findall(r'<tr class="worker".*?</tr>', page, flags=re.S)


def test_the_page_lists_each_worker_live_or_gone_with_the_steps_it_runs(
    workers: IJobStore,
) -> None:
    response = Client(make_app()).get("/workers")
    assert response.status_code == 200
    page = text(response)
    alpha, beta = rows_of(page)
    assert "<td>alpha</td>" in alpha and ">101<" in alpha and "web, etl" in alpha
    assert 'class="badge status-completed">live<' in alpha
    assert '<a class="id" href="/jobs/job-run">job-run</a> load (0.1), round 2, attempt 1' in alpha
    assert "<td>beta</td>" in beta and ">202<" in beta
    assert 'class="badge status-failed">gone<' in beta
    assert re.search(r"silent 1m 0[5-9]s", beta)
    assert 'href="/jobs/job-stuck"' in beta and "fetch (0.0)" in beta
    assert "job-done" not in page
    assert 'href="/workers" aria-current="page"' in page
    assert "data-live" in page  # refreshed live like the channels page


def test_an_idle_worker_and_an_empty_store(store: IJobStore) -> None:
    store.prune_workers(FAR_FUTURE)
    client = Client(make_app())
    assert "No worker process is known" in text(client.get("/workers"))
    now = utcnow()
    store.beat_worker(WorkerInfo("gamma:7:cc", "gamma", 7, now, now))
    try:
        [row] = rows_of(text(client.get("/workers")))
        assert "idle" in row and "live" in row
    finally:
        store.prune_workers(FAR_FUTURE)


def test_hostile_host_and_owner_stay_text(store: IJobStore) -> None:
    store.prune_workers(FAR_FUTURE)
    now = utcnow()
    hostile = "<script>window.pwned=1</script>"
    store.beat_worker(WorkerInfo(f"{hostile}:1:x", hostile, 1, now, now, channels=(hostile,)))
    try:
        page = text(Client(make_app()).get("/workers"))
        assert "<script>window" not in page
        assert html.escape(hostile, quote=False) in page
    finally:
        store.prune_workers(FAR_FUTURE)


def test_every_page_links_the_workers_page(store: IJobStore) -> None:
    client = Client(make_app())
    for path in ("/", "/schedules", "/channels"):
        assert 'href="/workers"' in text(client.get(path)), path


def test_the_page_shows_who_leads_the_sweep_its_last_pass_and_its_failing_duties(
    store: IJobStore,
) -> None:
    store.prune_workers(FAR_FUTURE)
    now = utcnow()
    error = "RuntimeError: <b>bad</b> row\x1b[2J\u202eevil"
    leading = SweepHealth(
        leading=True,
        last_full_pass=now - timedelta(seconds=3),
        failing=(DutyFailure("purge", error, now - timedelta(minutes=2), 42),),
    )
    store.beat_worker(WorkerInfo("lead:1:aa", "lead", 1, now, now, sweep=leading))
    store.beat_worker(WorkerInfo("other:2:bb", "other", 2, now, now, sweep=SweepHealth(False)))
    try:
        page = text(Client(make_app()).get("/workers"))
        sweep = page[page.index('<section class="sweep"') : page.index("</section>")]
        assert "Led by <strong>lead (pid 1)</strong>" in sweep
        assert re.search(r"\(\d+s ago\)", sweep)
        [duty] = re.findall(r'<tr class="failing-duty">.*?</tr>', sweep, flags=re.S)
        assert ">purge<" in duty and "<td>42</td>" in duty
        # Escaped for the terminal-like controls, then for HTML.
        assert "RuntimeError: &lt;b&gt;bad&lt;/b&gt; row\\x1b[2J\\u202eevil" in duty
        assert "\x1b" not in page and "\u202e" not in page
        lead_row, other_row = rows_of(page)
        assert "sweep leader" in lead_row and "sweep leader" not in other_row
    finally:
        store.prune_workers(FAR_FUTURE)


def test_the_page_says_when_no_live_worker_leads_the_sweep(store: IJobStore) -> None:
    store.prune_workers(FAR_FUTURE)
    now = utcnow()
    silent = now - timedelta(minutes=5)  # gone: its word that it leads is stale
    store.beat_worker(
        WorkerInfo("old:1:aa", "old", 1, silent, silent, sweep=SweepHealth(True, silent))
    )
    try:
        page = text(Client(make_app()).get("/workers"))
        assert "no leader" in page and "No live worker says it leads the recovery sweep" in page
        store.prune_workers(FAR_FUTURE)
        store.beat_worker(WorkerInfo("older:2:bb", "older", 2, now, now))  # an older release
        assert 'class="sweep"' not in text(Client(make_app()).get("/workers"))
    finally:
        store.prune_workers(FAR_FUTURE)
