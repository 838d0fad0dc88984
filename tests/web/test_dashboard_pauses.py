"""The Channels page's pause actions (POST with the CSRF token, as the others): a
channel and a task type paused and unpaused in the job store, on memory and PostgreSQL,
and refused when unknown, read-only or without a token."""

from __future__ import annotations

import base64
import logging
import re

import pytest
from werkzeug.test import Client

from pypepper_dramatiq import manager
from pypepper_dramatiq.records.pauses import CHANNEL as A_CHANNEL
from pypepper_dramatiq.records.pauses import TASK
from pypepper_dramatiq.stores.base import IJobStore
from pypepper_dramatiq.web import basic_auth, make_app

from .conftest import CHANNEL, text

#: A task type of the web tests' jobs (conftest's ``fetch``).
FETCH = "web-tests.fetch"


def signed_in() -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(b"ops:pw").decode()}


def token_of(client: Client, headers: dict[str, str]) -> str:
    found = re.search(
        r'name="csrf_token" value="([^"]+)"', text(client.get("/channels", headers=headers))
    )
    assert found
    return found.group(1)


def test_a_channel_and_a_task_type_are_paused_and_unpaused_by_who_is_signed_in(
    store: IJobStore, caplog: pytest.LogCaptureFixture
) -> None:
    manager.new(CHANNEL)
    client = Client(make_app(auth=basic_auth("ops", "pw")))
    headers = signed_in()
    token = token_of(client, headers)
    caplog.set_level(logging.INFO, logger="pypepper_dramatiq.web.app")

    def post(kind: str, action: str, name: str) -> str:
        answer = client.post(
            f"/actions/paused/{kind}/{action}",
            data={"csrf_token": token, "name": name},
            headers=headers,
        )
        assert answer.status_code == 303, text(answer)
        return str(answer.headers["Location"])

    assert post("channel", "pause", CHANNEL).endswith("notice=channel_paused")
    assert store.paused() == frozenset({(A_CHANNEL, CHANNEL)})
    page = text(client.get("/channels?notice=channel_paused", headers=headers))
    assert "The channel is paused" in page
    assert '<span class="badge status-scheduled">paused</span>' in page
    assert ">Unpause</button>" in page
    assert post("channel", "pause", CHANNEL).endswith("notice=already_paused")
    assert post("channel", "resume", CHANNEL).endswith("notice=channel_unpaused")
    assert post("channel", "resume", CHANNEL).endswith("notice=not_paused")

    assert post("task", "pause", FETCH).endswith("notice=task_paused")
    assert store.paused() == frozenset({(TASK, FETCH)})
    page = text(client.get("/channels", headers=headers))
    assert f"<td>{FETCH}</td>" in page
    assert post("task", "resume", FETCH).endswith("notice=task_unpaused")
    assert store.paused() == frozenset()
    assert "No task type is paused." in text(client.get("/channels", headers=headers))

    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("dashboard: ")]
    assert said[:2] == [
        f"dashboard: channel {CHANNEL} paused by dashboard:ops",
        f"dashboard: channel {CHANNEL} paused by dashboard:ops (no change)",
    ]


def test_unknown_names_are_refused_and_nothing_stored(store: IJobStore) -> None:
    client = Client(make_app(auth=basic_auth("ops", "pw")))
    headers = signed_in()
    token = token_of(client, headers)
    for kind, name in (("channel", "nobody-uses-it"), ("task", "no.such.task")):
        refused = client.post(
            f"/actions/paused/{kind}/pause",
            data={"csrf_token": token, "name": name},
            headers=headers,
        )
        assert refused.status_code == 404 and f"&#39;{name}&#39;" in text(refused), text(refused)
    empty = client.post("/actions/paused/task/pause", data={"csrf_token": token}, headers=headers)
    assert empty.status_code == 400
    assert store.paused() == frozenset()


def test_pause_actions_are_refused_without_a_token_read_only_or_signed_out(
    store: IJobStore,
) -> None:
    manager.new(CHANNEL)
    client = Client(make_app(auth=basic_auth("ops", "pw")))
    headers = signed_in()
    token = token_of(client, headers)
    path = "/actions/paused/channel/pause"
    for data in ({"name": CHANNEL}, {"csrf_token": token + "x", "name": CHANNEL}):
        refused = client.post(path, data=data, headers=headers)
        assert refused.status_code == 403 and "CSRF token" in text(refused)
    assert client.post(path, data={"csrf_token": token, "name": CHANNEL}).status_code == 401
    assert client.get(path, headers=headers).status_code == 405
    read_only = Client(make_app())
    page = text(read_only.get("/channels"))
    assert "/actions/paused/" not in page
    assert store.paused() == frozenset()
