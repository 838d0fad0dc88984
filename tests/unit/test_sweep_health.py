"""The recovery sweep's health as the worker rows carry it: its stored form, and which
row the workers page calls the leader."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from pypepper_dramatiq.records.record import utcnow
from pypepper_dramatiq.records.workers import (
    SWEEP_ERROR_LIMIT,
    DutyFailure,
    SweepHealth,
    WorkerInfo,
    sweep_leader,
)

NOW = utcnow()


def test_the_health_round_trips_through_its_dict_and_cuts_long_errors() -> None:
    health = SweepHealth(
        leading=True,
        last_full_pass=NOW,
        failing=(DutyFailure("purge", "x" * (SWEEP_ERROR_LIMIT + 50), NOW, 3),),
    )
    assert SweepHealth.from_dict(health.to_dict()) == health
    assert len(health.failing[0].error) == SWEEP_ERROR_LIMIT
    assert SweepHealth.from_dict(SweepHealth(leading=False).to_dict()) == SweepHealth(False)


@pytest.mark.parametrize(
    "stored",
    [None, "text", [1], {"failing": [{"error": "no duty"}]}, {"last_full_pass": "yesterday"}],
)
def test_a_value_that_is_no_health_reads_as_none(stored: Any) -> None:
    assert SweepHealth.from_dict(stored) is None  # the row is shown without it


def row(owner: str, seen: float, health: SweepHealth | None) -> WorkerInfo:
    host, pid, _ = owner.split(":")
    last = NOW - timedelta(seconds=seen)
    return WorkerInfo(owner, host, int(pid), last, last, sweep=health)


def test_the_leader_is_the_live_row_that_says_it_leads_with_the_latest_full_pass() -> None:
    earlier = row("a:1:x", 0, SweepHealth(True, NOW - timedelta(seconds=9)))
    latest = row("b:2:y", 1, SweepHealth(True, NOW - timedelta(seconds=1)))
    follower = row("c:3:z", 0, SweepHealth(False, NOW))
    gone = row("d:4:w", 600, SweepHealth(True, NOW))  # silent for ten minutes: gone
    old_release = row("e:5:v", 0, None)
    rows = [earlier, latest, follower, gone, old_release]
    assert sweep_leader(rows, NOW) == latest  # the lock moved: for a heartbeat both say so
    assert sweep_leader([follower, gone, old_release], NOW) is None
