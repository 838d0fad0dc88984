"""The dashboard in headless Chromium over jobs a real ``dramatiq`` worker process ran.

PostgreSQL and Redis are real; the dashboard is served by Werkzeug's server from
the test process (the producer's side: :class:`~.harness.Cluster` called
``setup()`` on them). Through the browser: the list, a filter, a job's page, a
cancel the running task sees, the retry of a failed job (it completes), and a
job's hostile error shown as text. Screenshots go to ``$PYPEPPER_SCREENSHOTS``
(default: the test's temporary directory); ``docs/images/`` holds one of them for
the README.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
from browser import chromium, launch, screenshot_folder  # tests/browser.py
from werkzeug.serving import make_server

from pypepper_dramatiq import Job, Workflow
from pypepper_dramatiq.records.links import RETRY_OF_KEY
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.web import basic_auth, make_app

from .harness import Cluster, wait_for
from .worker_app import CHANNEL, fragile, probe

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(600)]

USER, PASSWORD = "ops", "worker-browser-test"
HOSTILE_MESSAGE = 'Boom "><img src=x onerror="window.pwned = 2"><script>window.pwned = 3</script>'
HOSTILE_CATEGORY = "<script>window.pwned = 1</script>"

T = TypeVar("T")


def off_the_loop(call: Callable[[], T]) -> T:
    """``call()`` in a thread of its own: Playwright's sync API runs an event loop in
    this one, where ``Job.scheduled()`` refuses to run."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result(timeout=60)


@pytest.fixture
def dashboard(cluster: Cluster) -> Iterator[str]:
    """The dashboard of the process's store (the cluster's), with basic auth; its URL."""
    served = make_server("127.0.0.1", 0, make_app(auth=basic_auth(USER, PASSWORD)), threaded=True)
    thread = threading.Thread(target=served.serve_forever, name="dashboard", daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{served.server_port}"
    served.shutdown()
    thread.join(10)
    served.server_close()


def scheduled(category: str, *tasks: Any) -> Job:
    job = Job(category=category, channel_id=CHANNEL)
    job.workflows.append(Workflow(list(tasks)))
    job.scheduled()
    return job


def test_list_filter_cancel_and_retry_jobs_a_real_worker_runs(
    cluster: Cluster, dashboard: str, tmp_path: Path
) -> None:
    shots = screenshot_folder(tmp_path / "screenshots")
    cluster.start_worker(lease_seconds=5)
    done = scheduled("nightly-report", probe.task(name="extract", value=3))
    broken = scheduled(
        "invoices",
        probe.task(name="extract", value=7),
        fragile.task(name="load", flag="load-bug"),
        probe.task(name="publish", value=1),
    )
    hostile = scheduled(
        HOSTILE_CATEGORY, fragile.task(name="parse", flag="never", message=HOSTILE_MESSAGE)
    )
    cluster.wait_status([done], 60)
    cluster.wait_status([broken, hostile], 60, statuses=[Status.FAILED])
    slow = scheduled("backfill", probe.task(name="crunch", sleep=120, poll_cancel=True))
    wait_for(lambda: cluster.stamp("running", slow, "crunch"), 60, "the slow task to start")

    with launch(chromium()) as browser:
        context = browser.new_context(
            http_credentials={"username": USER, "password": PASSWORD},
            viewport={"width": 1280, "height": 860},
        )
        page = context.new_page()
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))

        # The list: the four jobs, newest first, the counts per status.
        page.goto(f"{dashboard}/")
        rows = page.locator("table.jobs tbody tr")
        assert rows.count() == 4
        assert [rows.nth(n).locator("td.id").inner_text() for n in range(4)] == [
            slow.id,
            hostile.id,
            broken.id,
            done.id,
        ]
        assert page.locator(".counts a", has_text="Failed").inner_text().startswith("2")
        assert page.evaluate("window.pwned") is None
        page.screenshot(path=str(shots / "worker-jobs.png"), full_page=True)

        # Filter: the failed jobs, then a text search among them.
        page.select_option("select[name=status]", "Failed")
        page.fill("input[name=q]", "INVOICE")
        page.click("form.filters button[type=submit]")
        assert "status=Failed" in page.url and "q=INVOICE" in page.url
        assert rows.count() == 1 and rows.first.locator("td.id").inner_text() == broken.id

        # A failed job's page: the tasks, the attempt with its error, the timeline.
        page.click(f"text={broken.id}")
        assert page.locator("#job-status").inner_text() == "Failed"
        tasks = page.locator("table.tasks").inner_text()
        assert "extract" in tasks and "RuntimeError: broken" in tasks
        assert "load: attempt 1 failed" in page.locator("ol.timeline").inner_text()
        page.screenshot(path=str(shots / "worker-job-failed.png"), full_page=True)

        # The hostile job: its error and category are text; nothing ran.
        page.goto(f"{dashboard}/jobs/{hostile.id}")
        assert HOSTILE_MESSAGE in page.locator("pre.error-text").inner_text()
        assert HOSTILE_CATEGORY in page.locator(".facts").inner_text()
        assert page.locator("main img").count() == 0
        assert page.evaluate("window.pwned") is None and dialogs == []

        # Cancel the running job: the task itself sees it.
        page.goto(f"{dashboard}/jobs/{slow.id}")
        assert page.locator("#job-status").inner_text() == "InProgress"
        page.click("button:has-text('Cancel job')")
        assert "Yes, cancel the job" in page.content()  # the confirmation page
        page.click("button:has-text('Yes, cancel the job')")
        assert page.locator("#job-status").inner_text() == "Cancelled"
        wait_for(lambda: cluster.stamp("cancel_seen", slow, "crunch"), 30, "the task to see it")
        assert cluster.saved(slow).status is Status.CANCELLED

        # Retry the failed job once the fix is deployed: a new job, which completes
        # without running "extract" again.
        cluster.redis.set("fixed:load-bug", "1")
        page.goto(f"{dashboard}/jobs/{broken.id}")
        page.click("button:has-text('Retry')")
        retry_id = page.locator("h1 .id").inner_text()
        assert retry_id != broken.id
        assert page.locator(f"a[href$='/jobs/{broken.id}']").first.is_visible()
        [retried] = cluster.wait_status([Job(id=retry_id)], 60).values()
        assert retried.payload is not None and retried.payload[RETRY_OF_KEY] == broken.id
        assert retried.result("extract") == 7  # kept from the original, not run again
        assert retried.result("load") == "fixed" and retried.result("publish") == 1
        assert cluster.runs(Job(id=retry_id), "extract") == 0
        assert cluster.runs(Job(id=retry_id), "publish") == 1
        page.reload()
        assert page.locator("#job-status").inner_text() == "Completed"
        page.screenshot(path=str(shots / "worker-job-retried.png"), full_page=True)
        page.goto(f"{dashboard}/jobs/{broken.id}")
        children = page.locator("ul.children").inner_text()
        assert retry_id in children and "retried as" in children
        assert cluster.saved(broken).status is Status.FAILED  # the original stays as it ended
        assert page.evaluate("window.pwned") is None and dialogs == []
        context.close()
