"""The paused set (``pause``, ``resume``, ``paused``) and the release of the rows held
for a pause (``release_paused``), on every store.

Run on memory, PostgreSQL and MariaDB; a store with only the abstract methods
(``IJobStore``'s defaults, as a third party's) answers that nothing is paused and
refuses to pause with a typed error.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from pypepper_dramatiq import PausingUnsupportedError
from pypepper_dramatiq.records.pauses import CHANNEL, PAUSED_UNTIL, TASK
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import HELD_FOR_PAUSE, HELD_FOR_TIME, IJobStore

from .test_store_contract import T0, MinimalStore, job, store, stored

__all__ = ["store"]


def test_a_pause_is_stored_once_and_resumed_once(store: IJobStore) -> None:
    if isinstance(store, MinimalStore):
        assert store.paused() == frozenset()
        with pytest.raises(PausingUnsupportedError, match="MinimalStore"):
            store.pause(CHANNEL, "emails", T0)
        with pytest.raises(PausingUnsupportedError):
            store.resume(CHANNEL, "emails")
        return
    assert store.pause(CHANNEL, "emails", T0) is True
    assert store.pause(CHANNEL, "emails", T0) is False  # already paused
    assert store.pause(TASK, "emails", T0) is True  # a task of the same name is another pause
    assert store.paused() == frozenset({(CHANNEL, "emails"), (TASK, "emails")})
    assert store.resume(CHANNEL, "emails") is True
    assert store.resume(CHANNEL, "emails") is False
    assert store.paused() == frozenset({(TASK, "emails")})


def test_a_kind_that_is_no_pause_is_refused(store: IJobStore) -> None:
    if isinstance(store, MinimalStore):
        pytest.skip("keeps no paused set")
    with pytest.raises(ValueError, match="'queue'"):
        store.pause("queue", "emails", T0)
    assert store.paused() == frozenset()


def test_resume_releases_held_rows_oldest_first_but_those_of_paused_channels(
    store: IJobStore,
) -> None:
    if isinstance(store, MinimalStore):
        pytest.skip("keeps no paused set")
    now = T0 + timedelta(hours=1)
    held = [
        job(
            "first-b",
            channel_id="b",
            status=Status.SCHEDULED,
            release_at=PAUSED_UNTIL,
            created=T0 + timedelta(seconds=2),
        ),
        job(
            "first-a",
            channel_id="a",
            status=Status.SCHEDULED,
            release_at=PAUSED_UNTIL,
            created=T0 + timedelta(seconds=1),
        ),
        job(
            "step-a",
            channel_id="a",
            status=Status.IN_PROGRESS,
            lease_expires=PAUSED_UNTIL,
            state={"cursor": [0, 1, 0, 0]},
            created=T0 + timedelta(seconds=3),
        ),
        job("kept", channel_id="still", status=Status.SCHEDULED, release_at=PAUSED_UNTIL),
        job("delayed", channel_id="a", status=Status.SCHEDULED, release_at=T0 + timedelta(days=3)),
    ]
    for record in held:
        assert store.put(record)
    assert store.held_counts()[("a", HELD_FOR_PAUSE)] == 2  # a first step, a later one
    assert store.held_counts()[("a", HELD_FOR_TIME)] == 1
    versions = {r.id: stored(store, r.id).version for r in held}

    assert store.release_paused(now, keep_channels=["still"]) == 3

    # Due at once, in submit order: the sweep sends by release_at, recovery by lease_expires.
    assert [r.id for r in store.due_releases(now)] == ["first-a", "first-b"]
    step = stored(store, "step-a")
    assert step.lease_expires == T0 + timedelta(seconds=3) and step.lease_owner is None
    assert step.version == versions["step-a"] + 1
    assert stored(store, "kept").release_at == PAUSED_UNTIL
    assert stored(store, "delayed").release_at == T0 + timedelta(days=3)
    recovered = store.recover_expired(now, now + timedelta(minutes=1))
    assert [r.id for r in recovered] == ["step-a"]
