"""The dashboard in a real browser: Debian's headless Chromium driven by Playwright.

Served by Werkzeug's server on a free port over PostgreSQL, with jobs a real
in-process worker ran. One browser goes without JavaScript (every page works
without it: list, filter, open a job, cancel it), one with it (hostile text does
not run, live refresh follows a job). Screenshots go to ``$PYPEPPER_SCREENSHOTS``
(default: the test's temporary directory).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
from browser import chromium, launch, screenshot_folder  # tests/browser.py
from process_state import clean_process_state
from werkzeug.serving import make_server

from pypepper_dramatiq import Job, manager
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import IJobStore
from pypepper_dramatiq.stores.registry import set_job_store
from pypepper_dramatiq.stores.sql import SqlJobStore
from pypepper_dramatiq.web import basic_auth, make_app

from .conftest import CHANNEL, put, run_job, two_step_job

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(600)]  # the first may install Chromium

USER, PASSWORD = "ops", "browser-test"
HOSTILE_CATEGORY = "<script>window.pwned = 1</script>"
HOSTILE_ERROR = 'Boom "><img src=x onerror="window.pwned = 2">'


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with launch(chromium()) as launched:
        yield launched


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    return screenshot_folder(tmp_path / "screenshots")


@pytest.fixture
def store(pg_store: SqlJobStore) -> Iterator[IJobStore]:
    """PostgreSQL as the process's store (the browser tests run on it alone)."""
    with clean_process_state():
        set_job_store(pg_store)
        yield pg_store


@pytest.fixture
def server(store: IJobStore) -> Iterator[str]:
    """The dashboard with basic auth on a free port of 127.0.0.1; its base URL."""
    app = make_app(auth=basic_auth(USER, PASSWORD))
    served = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=served.serve_forever, name="dashboard", daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{served.server_port}"
    served.shutdown()
    thread.join(10)
    served.server_close()


T = TypeVar("T")


def off_the_loop(call: Callable[[], T]) -> T:
    """``call()`` in a thread of its own: Playwright's sync API runs an event loop in
    this one, where ``Job.scheduled()`` refuses to run."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result(timeout=60)


def scheduled_job(category: str = "to-cancel") -> str:
    """A job waiting in its channel (no worker takes it)."""
    manager.new(CHANNEL)
    return off_the_loop(two_step_job(category).scheduled)


def test_list_filter_open_and_cancel_a_job_without_javascript(
    store: IJobStore, server: str, browser: Any, shots: Path
) -> None:
    done = off_the_loop(lambda: run_job(two_step_job("nightly")))
    waiting = scheduled_job()
    context = browser.new_context(
        http_credentials={"username": USER, "password": PASSWORD},
        java_script_enabled=False,
        viewport={"width": 1280, "height": 800},
    )
    page = context.new_page()
    page.goto(f"{server}/")
    assert page.title().startswith("Jobs")
    rows = page.locator("table.jobs tbody tr")
    assert rows.count() == 2
    assert page.locator(".counts a", has_text="Scheduled").inner_text().startswith("1")
    page.screenshot(path=str(shots / "jobs.png"), full_page=True)

    page.select_option("select[name=status]", "Scheduled")
    page.click("form.filters button[type=submit]")
    assert "status=Scheduled" in page.url
    assert rows.count() == 1 and rows.first.inner_text().strip().startswith(waiting)

    page.click(f"text={waiting}")
    assert page.locator("#job-status").inner_text() == "Scheduled"
    assert "a free worker" in page.locator("ul.waits").inner_text()
    page.screenshot(path=str(shots / "job-scheduled.png"), full_page=True)
    page.click("button:has-text('Cancel job')")
    assert "Yes, cancel the job" in page.content()  # the confirmation page
    page.click("button:has-text('Yes, cancel the job')")
    assert page.locator("#job-status").inner_text() == "Cancelled"
    assert "The job was cancelled." in page.locator(".banner.notice").inner_text()
    page.screenshot(path=str(shots / "job-cancelled.png"), full_page=True)
    record = store.get(waiting)
    assert record is not None and record.status is Status.CANCELLED

    page.goto(f"{server}/jobs/{done}")
    page.click("details.result summary")
    assert "n" * 300 in page.locator("details.result pre").inner_text()
    page.click("details.history summary >> nth=0")
    attempts = page.locator("table.attempts").first.inner_text()
    assert "ValueError: first try fails: <b>not bold</b>" in attempts and "succeeded" in attempts
    page.screenshot(path=str(shots / "job-completed.png"), full_page=True)
    context.close()


def test_hostile_text_does_not_run_and_live_refresh_follows_a_job(
    store: IJobStore, server: str, browser: Any, shots: Path
) -> None:
    put(store, "hostile", 0, status=Status.FAILED, category=HOSTILE_CATEGORY, error=HOSTILE_ERROR)
    waiting = scheduled_job("followed")
    context = browser.new_context(
        http_credentials={"username": USER, "password": PASSWORD},
        viewport={"width": 1280, "height": 800},
    )
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    for path in ("/", "/jobs/hostile", "/?status=Failed"):
        page.goto(f"{server}{path}")
        assert page.evaluate("window.pwned") is None, path
    assert HOSTILE_ERROR in page.locator("td.error").inner_text()
    page.goto(f"{server}/jobs/hostile")
    assert page.locator("pre.error-text").inner_text() == HOSTILE_ERROR
    assert HOSTILE_CATEGORY in page.locator(".facts").inner_text()
    assert page.locator("main img").count() == 0 and dialogs == []
    page.screenshot(path=str(shots / "job-hostile.png"), full_page=True)

    # Live refresh: tick "live", cancel the job elsewhere, and the page follows.
    page.goto(f"{server}/jobs/{waiting}")
    live = page.locator("#live-refresh")
    assert live.is_visible()
    live.check()
    assert off_the_loop(lambda: Job.cancel_saved(waiting))
    from playwright.sync_api import expect

    # Without a reload: the page's own script fetched it again (in 5 s).
    expect(page.locator("#job-status")).to_have_text("Cancelled", timeout=15_000)
    assert live.is_checked()
    assert page.evaluate("window.pwned") is None
    context.close()


def test_a_huge_error_wraps_and_spoofing_text_is_shown_isolated_and_visible(
    store: IJobStore, server: str, browser: Any, shots: Path
) -> None:
    huge = "E" * 20_000  # one word: nothing to break at but anywhere
    rtl = "\u05e9\u05dc\u05d5\u05dd-1"  # Hebrew, then "-1"
    history = {
        "0.0": [
            {
                "round": 0,
                "attempt": 0,
                "outcome": "failed",
                "worker": "w-1",
                "error_type": "ValueError",
                "message": huge,
                "traceback": f"Traceback (most recent call last):\n  {huge}\nValueError",
            }
        ]
    }
    put(
        store,
        "huge",
        0,
        status=Status.FAILED,
        category=f"{rtl}\u202eevil\u200b",
        error=f"ValueError: {huge}",
        state={"history": history, "errors": {"0.0": f"ValueError: {huge}"}},
    )
    context = browser.new_context(
        http_credentials={"username": USER, "password": PASSWORD},
        viewport={"width": 1280, "height": 800},
    )
    page = context.new_page()
    page.goto(f"{server}/jobs/huge")
    page.click("details.history details summary")  # the traceback (the failed task's is open)
    widths = page.evaluate(
        "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(shots / "job-huge-error.png"), full_page=False)
    page.locator("table.tasks").evaluate("e => e.scrollIntoView()")
    page.screenshot(path=str(shots / "job-huge-error-tasks.png"), full_page=False)
    assert widths[0] <= widths[1] + 2, widths  # was 277,295 px wide
    assert page.locator("pre.error-text").inner_text() == f"ValueError: {huge}"
    category = page.locator(".facts dd", has_text="evil")
    # The bidi override and the zero-width space are shown as their escapes, and the
    # right-to-left text is isolated from what stands around it.
    assert category.inner_text() == f"{rtl}\\u202eevil\\u200b"
    assert category.evaluate("e => getComputedStyle(e).unicodeBidi") == "isolate"
    assert page.locator("h1 .id").evaluate("e => getComputedStyle(e).unicodeBidi") == "isolate"
    page.goto(f"{server}/")
    assert page.evaluate("document.documentElement.scrollWidth") <= widths[1] + 2
    page.screenshot(path=str(shots / "jobs-spoofing-category.png"), full_page=False)
    context.close()
