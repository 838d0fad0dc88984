"""Damaged rows next to live work, with a real ``dramatiq`` worker, Redis and each SQL store.

Rows changed by raw SQL (a ``state`` that is a list) sit in the very duties the
live jobs need: one held in the store for a later start, due now (``release_held``),
and one waiting for a parent that completed (``settle_waits``). The sweep must
still release the live job held for a later start and run the ``after=`` child
once its parent completed, skip each damaged row (logged once), and leave the
damaged rows as they are; the dashboard then lists them marked Damaged and shows
the damaged job's page, every answer with the security headers.
"""

from __future__ import annotations

import html
import json
from datetime import timedelta
from typing import Any

import pytest
from werkzeug.test import Client

from pypepper_dramatiq import Job, Status, Workflow, get_job_store
from pypepper_dramatiq.records.record import JobRecord, utcnow
from pypepper_dramatiq.rules.start_times import SHORT_DELAY_SECONDS
from pypepper_dramatiq.web import make_app
from pypepper_dramatiq.web.app import SECURITY_HEADERS

from .conftest import BOTH_STORES
from .harness import Cluster, raw, wait_for
from .worker_app import CHANNEL, probe

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

PAYLOAD = {"workflows": [{"tasks": [{"name": "t", "executor_id": "none", "params": {}}]}]}
#: What a listing says of a row whose state is a list.
REASON = "column 'state': expected an object, found a list"
HELD = "dmg-held"
WAITING = "dmg-waiting"


def secured(headers: Any) -> None:
    for name, value in SECURITY_HEADERS.items():
        assert headers.get(name) == value, name


def job_of(name: str) -> Job:
    job = Job(category="it", channel_id=CHANNEL)
    job.workflows.append(Workflow([probe.task(name=name, value=name)]))
    return job


@pytest.mark.parametrize("store_backend", BOTH_STORES, indirect=True)
def test_the_sweep_releases_and_settles_live_jobs_past_damaged_rows_and_the_dashboard_shows_them(
    cluster: Cluster,
) -> None:
    store = get_job_store()
    past = utcnow() - timedelta(minutes=5)
    # A held row due for release, and a row waiting for a parent that completed:
    # both in the duties the live jobs below need, both damaged by raw SQL.
    assert store.put(
        JobRecord(
            id=HELD, channel_id=CHANNEL, payload=PAYLOAD, status=Status.SCHEDULED, release_at=past
        )
    )
    assert store.put(
        JobRecord(id="dmg-parent", channel_id=CHANNEL, payload=PAYLOAD, status=Status.COMPLETED)
    )
    assert store.put(
        JobRecord(
            id=WAITING,
            channel_id=CHANNEL,
            payload=PAYLOAD,
            status=Status.SCHEDULED,
            waits={"parents": ["dmg-parent"]},
        )
    )
    for job_id in (HELD, WAITING):
        assert (
            raw(
                cluster.store_uri,
                "UPDATE scheduler_jobs SET state = '[1,2,3]' WHERE id = :id",
                id=job_id,
            )
            == 1
        )

    cluster.start_worker(sweep_interval=0.3)
    parent = cluster.schedule(probe.task(name="parent", value="p"))
    child = job_of("child")
    child.scheduled(after=[parent.id])  # settled, then sent, by the sweep
    later = job_of("later")
    later.scheduled(delay=SHORT_DELAY_SECONDS + 1)
    held = store.get(later.id)
    assert held is not None and held.release_at is not None  # only the sweep releases it

    records = cluster.wait_status([parent, child, later], 60)

    # The child ran after its parent ended; the held job no earlier than its start.
    [parent_end] = cluster.times("ends", parent, "parent")
    [child_start] = cluster.times("starts", child, "child")
    [later_start] = cluster.times("starts", later, "later")
    assert child_start >= parent_end
    assert held.not_before is not None and later_start >= held.not_before.timestamp()
    assert set(records) == {parent.id, child.id, later.id}

    def skipped_each() -> bool:
        log = cluster.logs()
        return all(
            f"job {job_id} skipped: its row cannot be read" in log for job_id in (HELD, WAITING)
        )

    wait_for(skipped_each, 30, f"the sweep to skip each damaged row:\n{cluster.logs()}")
    log = "\n".join(worker.log() for worker in cluster.workers)
    skips = [line.split("] ")[-1] for line in log.splitlines() if "skipped: its row" in line]
    assert len(skips) == len(set(skips)), log[-4000:]  # once each, not once a pass
    assert "Traceback" not in log, log[-4000:]
    rows = raw(
        cluster.store_uri,
        "SELECT id, status, state FROM scheduler_jobs WHERE id IN (:held, :waiting)",
        held=HELD,
        waiting=WAITING,
    )
    # MariaDB's driver gives a JSON column as its text.
    as_read = {
        job_id: (status, json.loads(state) if isinstance(state, str) else state)
        for job_id, status, state in rows
    }
    assert as_read == {
        HELD: ("Scheduled", [1, 2, 3]),
        WAITING: ("Scheduled", [1, 2, 3]),
    }

    # The dashboard, served in process on the same store.
    client = Client(make_app())
    listing = client.get("/")
    assert listing.status_code == 200
    secured(listing.headers)
    page = html.unescape(listing.get_data(as_text=True))
    for job_id in (HELD, WAITING):
        row = page.split(f'href="/jobs/{job_id}"')[1].split("</tr>")[0]
        assert 'class="badge status-damaged"' in row and ">Damaged</span>" in row, row
        assert REASON in row, row
    for job in (parent, child, later):
        row = page.split(f'href="/jobs/{job.id}"')[1].split("</tr>")[0]
        assert ">Completed</span>" in row, row

    detail = client.get(f"/jobs/{HELD}")
    assert detail.status_code == 200
    secured(detail.headers)
    shown = html.unescape(detail.get_data(as_text=True))
    assert '<p class="error-text" id="damage">' + REASON + "</p>" in shown
    assert "<dt>Stored status</dt><dd>Scheduled</dd>" in shown
    assert "Cancel job" not in shown
