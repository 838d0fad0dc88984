"""The operator's console in a real browser (Debian's headless Chromium, Playwright) over
PostgreSQL and Redis: a channel stopped from its page is stopped in Redis, a search by an
error's text finds its job, a bulk retry of three failed jobs completes them.
Screenshots go to ``$PYPEPPER_SCREENSHOTS`` (default: the test's temporary directory)."""

from __future__ import annotations

import asyncio
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
from browser import chromium, launch, screenshot_folder  # tests/browser.py
from dramatiq.brokers.redis import RedisBroker
from process_state import clean_process_state
from werkzeug.serving import make_server

from pypepper_dramatiq import Context, Job, Task, Worker, Workflow, manager, workflow_task
from pypepper_dramatiq.drivers.dramatiq.recovery import RecoverySweeper
from pypepper_dramatiq.records.record import utcnow
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import IJobStore
from pypepper_dramatiq.stores.registry import set_job_store
from pypepper_dramatiq.stores.sql import SqlJobStore
from pypepper_dramatiq.transport.redis import RedisGate
from pypepper_dramatiq.web import basic_auth, make_app

from .conftest import CHANNEL, run_job

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.timeout(600)]

USER, PASSWORD = "ops", "console-test"
#: While True, the task below fails.
BROKEN = {"on": True}


@workflow_task(name="console-tests.cool")
def cool(task: Task, context: Context) -> str:
    if BROKEN["on"]:
        raise RuntimeError(f"reactor {context.job_id[:8]} overheated")
    return "cooled"


def failed_job() -> str:
    """A job run by the in-process worker that failed (its task raised)."""
    job = Job(category="reactor", channel_id=CHANNEL)
    job.workflows.append(Workflow([cool.task(name="cool")]))
    return off_the_loop(lambda: run_job(job))


T = TypeVar("T")


def off_the_loop(call: Callable[[], T]) -> T:
    """``call()`` in a thread of its own: Playwright's sync API runs an event loop in
    this one, where scheduling a job refuses to run."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result(timeout=60)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with launch(chromium()) as launched:
        yield launched


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    return screenshot_folder(tmp_path / "screenshots")


@pytest.fixture
def store(pg_store: SqlJobStore) -> Iterator[IJobStore]:
    with clean_process_state():
        set_job_store(pg_store)
        BROKEN["on"] = True
        yield pg_store


@pytest.fixture
def broker(redis_url: str) -> Iterator[RedisBroker]:
    made = RedisBroker(url=redis_url)  # type: ignore[no-untyped-call]
    yield made
    made.close()


@pytest.fixture
def server(store: IJobStore, broker: RedisBroker) -> Iterator[str]:
    """The dashboard with basic auth over the Redis broker, on a free port; its URL."""
    app = make_app(broker=broker, auth=basic_auth(USER, PASSWORD))
    served = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=served.serve_forever, name="dashboard", daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{served.server_port}"
    served.shutdown()
    thread.join(10)
    served.server_close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(
        http_credentials={"username": USER, "password": PASSWORD},
        viewport={"width": 1280, "height": 800},
    )
    yield context.new_page()
    context.close()


def test_a_channel_stopped_resized_and_resumed_on_its_page_is_so_in_redis(
    server: str, broker: RedisBroker, page: Any, shots: Path
) -> None:
    client: redis.Redis = broker.client
    name = f"console-{uuid.uuid4().hex[:8]}"
    gate = RedisGate(client, name, 3)
    gate.connect()
    try:
        page.goto(f"{server}/channels")
        row = page.locator("table.channels tr", has_text=name)
        row.locator("button", has_text="Stop").click()
        assert "The channel is stopped" in page.locator(".banner.notice").inner_text()
        assert RedisGate(client, name).stopped  # read from Redis by a gate of its own
        row = page.locator("table.channels tr", has_text=name)
        assert "stopped" in row.inner_text()
        page.screenshot(path=str(shots / "channel-stopped.png"), full_page=True)

        row.locator("input[name=size]").fill("12")
        row.locator("button", has_text="Resize").click()
        assert RedisGate(client, name).maxsize == 12
        page.locator("table.channels tr", has_text=name).locator(
            "button", has_text="Resume"
        ).click()
        assert not RedisGate(client, name).stopped
        assert "12" in page.locator("table.channels tr", has_text=name).inner_text()
        page.screenshot(path=str(shots / "channel-resumed.png"), full_page=True)
    finally:
        gate.reset()


def test_a_channel_listed_from_redis_is_paused_and_unpaused_on_its_page(
    store: IJobStore, server: str, broker: RedisBroker, page: Any, shots: Path
) -> None:
    client: redis.Redis = broker.client
    name = f"console-{uuid.uuid4().hex[:8]}"
    gate = RedisGate(client, name, 3)
    gate.connect()  # some process used it: listed, and known, though no job uses it
    try:
        page.goto(f"{server}/channels")
        row = page.locator("table.channels tr", has_text=name)
        row.locator("button", has_text="Pause").click()
        assert "The channel is paused" in page.locator(".banner.notice").inner_text()
        assert store.paused() == frozenset({("channel", name)})
        row = page.locator("table.channels tr", has_text=name)
        assert "paused" in row.inner_text()
        page.screenshot(path=str(shots / "channel-paused.png"), full_page=True)
        row.locator("button", has_text="Unpause").click()
        assert "The channel is unpaused" in page.locator(".banner.notice").inner_text()
        assert store.paused() == frozenset()
    finally:
        gate.reset()


def test_a_search_by_an_errors_text_finds_the_job(
    store: IJobStore, server: str, page: Any, shots: Path
) -> None:
    failed = failed_job()
    others = [off_the_loop(lambda: run_job(job_of("other"))) for _ in range(2)]
    record = store.get(failed)
    assert record is not None and record.status is Status.FAILED
    assert f"reactor {failed[:8]} overheated" in (record.error or "")
    page.goto(f"{server}/")
    page.fill("input[name=q]", f"{failed[:8]} OVERHEATED")
    page.click("form.filters button[type=submit]")
    rows = page.locator("table.jobs tbody tr")
    assert rows.count() == 1 and rows.first.inner_text().strip().startswith(failed)
    assert all(job_id not in page.content() for job_id in others)
    page.screenshot(path=str(shots / "search-by-error.png"), full_page=True)


def job_of(category: str) -> Job:
    job = Job(category=category, channel_id=CHANNEL)
    job.workflows.append(Workflow([cool.task(name="cool")]))
    return job


def test_a_bulk_retry_of_three_failed_jobs_completes_them(
    store: IJobStore, server: str, page: Any, shots: Path
) -> None:
    failed = [failed_job() for _ in range(3)]
    done = off_the_loop(lambda: run_job(job_of("fine-later")))  # fails too: left unticked
    assert all(store.get(job_id).status is Status.FAILED for job_id in failed)  # type: ignore[union-attr]
    BROKEN["on"] = False  # the fix is deployed
    page.goto(f"{server}/?status=Failed")
    for job_id in failed:
        page.check(f"input[name=ids][value='{job_id}']")
    page.screenshot(path=str(shots / "bulk-selected.png"), full_page=True)
    page.click("button:has-text('Retry selected')")
    assert page.locator("#bulk-title").inner_text() == "Retry 3 failed jobs?"
    page.screenshot(path=str(shots / "bulk-confirm.png"), full_page=True)
    page.click("button:has-text('Yes, retry 3 jobs')")
    assert page.locator("#bulk-done").inner_text() == "3 of 3 jobs retried"
    page.screenshot(path=str(shots / "bulk-done.png"), full_page=True)
    retries = {
        str((r.payload or {})["retry_of"]): r.id
        for r in store.list()
        if (r.payload or {}).get("retry_of")
    }
    assert sorted(retries) == sorted(failed)

    def work() -> None:
        worker = Worker(manager.available(CHANNEL))
        for _ in retries:
            asyncio.run(worker.run_once())

    off_the_loop(work)
    for new_id in retries.values():
        record = store.get(new_id)
        assert record is not None and record.status is Status.COMPLETED, record
    untouched = store.get(done)
    assert untouched is not None and untouched.status is Status.FAILED
    page.goto(f"{server}/")
    for job_id, new_id in retries.items():
        row = page.locator("table.jobs tbody tr", has_text=job_id)
        assert f"retried as {new_id}" in row.inner_text()
    page.screenshot(path=str(shots / "bulk-retried-list.png"), full_page=True)


def test_the_schedules_page_reads_its_cron_and_its_firings(
    store: IJobStore, server: str, page: Any, shots: Path
) -> None:
    from datetime import timedelta

    from pypepper_dramatiq.schedules.firing import fire_due, recurring

    manager.new(CHANNEL)
    schedule = recurring(
        "reactor check", "*/15 * * * 1-5", job_of("checks"), catch_up="all", overlap="allow"
    )
    start = schedule.next_slot - timedelta(days=7)
    assert store.advance_recurring(schedule.evolve(next_slot=start))
    fired = off_the_loop(lambda: fire_due(now=start + timedelta(minutes=40)))
    assert len(fired) == 3
    off_the_loop(lambda: asyncio.run(Worker(manager.available(CHANNEL)).run_once()))
    page.goto(f"{server}/schedules")
    row = page.locator("table.schedules tr", has_text="reactor check")
    assert "Every 15 minutes, Monday through Friday" in row.inner_text()
    assert row.locator("td.firings li").count() == 5  # the five latest slots
    assert row.locator("td.firings .badge").count() == 3  # of which three fired
    assert row.locator("td.firings li", has_text="no job stored").count() == 2
    assert row.locator("td.firings .badge", has_text="Failed").count() == 1
    page.screenshot(path=str(shots / "schedules.png"), full_page=True)


def test_the_charts_page_draws_the_jobs_a_worker_ended(
    store: IJobStore, server: str, page: Any, shots: Path
) -> None:
    failed = [failed_job() for _ in range(2)]
    BROKEN["on"] = False
    completed = [off_the_loop(lambda: run_job(job_of("fine"))) for _ in range(3)]
    assert all(store.get(j).status is Status.COMPLETED for j in completed)  # type: ignore[union-attr]
    page.goto(f"{server}/charts")
    bars = page.locator("#ended-chart rect.bar")
    assert bars.count() >= 2
    said = " ".join(bars.nth(i).locator("title").text_content() for i in range(bars.count()))
    assert sum(int(n) for n in re.findall(r": (\d+) Completed", said)) == 3
    assert sum(int(n) for n in re.findall(r": (\d+) Failed", said)) == len(failed)
    page.screenshot(path=str(shots / "charts-hour.png"), full_page=True)
    page.click("text=last week")
    assert page.locator("#ended-chart rect.bar").count() >= 2
    page.screenshot(path=str(shots / "charts-week.png"), full_page=True)


def test_the_charts_page_draws_the_times_and_depths_the_sweep_rolled_up(
    store: IJobStore, server: str, broker: RedisBroker, page: Any, shots: Path
) -> None:
    failed = [failed_job() for _ in range(2)]
    BROKEN["on"] = False
    completed = [off_the_loop(lambda: run_job(job_of("fine"))) for _ in range(3)]
    off_the_loop(lambda: job_of("waiting").scheduled())  # left waiting in its channel
    # The sweep leader's duty now: the channel's depth sampled, the ends too recent (it
    # reads them a minute behind the clock); then as it runs two minutes from now, twice
    # (the second adds nothing).
    sweep = RecoverySweeper(broker, "charts-test", lease_seconds=30, interval=1)
    assert off_the_loop(lambda: sweep.roll_up_activity(utcnow())) == 0
    later = utcnow() + timedelta(minutes=2)
    assert off_the_loop(lambda: sweep.roll_up_activity(later)) == len(failed) + len(completed)
    assert off_the_loop(lambda: sweep.roll_up_activity(later)) == 0
    page.goto(f"{server}/charts")
    assert "From the activity rollup" in page.locator("p.source").inner_text()
    bars = page.locator("#ended-chart rect.bar")
    said = " ".join(bars.nth(i).locator("title").text_content() for i in range(bars.count()))
    assert sum(int(n) for n in re.findall(r": (\d+) Completed", said)) == 3
    assert sum(int(n) for n in re.findall(r": (\d+) Failed", said)) == 2
    for chart, what in (("#wait-chart", "waited up to"), ("#run-chart", "ran up to")):
        lines = page.locator(f"{chart} g.series")
        assert lines.count() == 2  # p50 and p95
        assert what in lines.first.locator("circle title").first.text_content()
    depth = page.locator(f"#depth-chart g.series[data-name='{CHANNEL}'] circle title")
    assert depth.count() == 1
    assert depth.first.text_content().endswith(f"up to 1 waiting in {CHANNEL}")
    page.screenshot(path=str(shots / "charts-rollup-hour.png"), full_page=True)
    page.click("text=last day")
    assert page.locator("#wait-chart g.series").count() == 2
    page.screenshot(path=str(shots / "charts-rollup-day.png"), full_page=True)
