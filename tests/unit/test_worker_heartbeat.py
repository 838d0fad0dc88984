"""The lease keeper's heartbeat row: written at its start and once per heartbeat (not per
step), deleted when it stops, and a store outage costs a logged outage, not the thread."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator

import dramatiq
import pytest
from process_state import clean_process_state

from pypepper_dramatiq import manager
from pypepper_dramatiq.drivers.dramatiq.leases import LeaseKeeper
from pypepper_dramatiq.engine.running import InFlight
from pypepper_dramatiq.errors import StoreUnavailableError
from pypepper_dramatiq.records.record import utcnow
from pypepper_dramatiq.records.workers import HEARTBEAT_SECONDS, WorkerInfo, heartbeat_seconds
from pypepper_dramatiq.stores.memory import MemoryJobStore
from pypepper_dramatiq.stores.registry import set_job_store

OWNER = "test-host:1:abcdef01"


class BeatCounting(MemoryJobStore):
    """Counts the heartbeats; the first ``failures`` of them find the store unreachable."""

    def __init__(self, failures: int = 0) -> None:
        super().__init__()
        self.beats: list[WorkerInfo] = []
        self.failures = failures
        self.forgotten = threading.Event()

    def beat_worker(self, worker: WorkerInfo) -> None:
        self.beats.append(worker)
        if len(self.beats) <= self.failures:
            raise StoreUnavailableError("job store unavailable, connection refused")
        super().beat_worker(worker)

    def forget_worker(self, owner: str) -> bool:
        self.forgotten.set()
        return super().forget_worker(owner)


@pytest.fixture(autouse=True)
def clean() -> Iterator[None]:
    with clean_process_state():
        yield


def keeper(heartbeat: float) -> LeaseKeeper:
    return LeaseKeeper(InFlight(), OWNER, lease_seconds=3, cancel_grace=1, heartbeat=heartbeat)


def test_the_heartbeat_is_every_5_seconds_or_the_renewal_interval_if_longer() -> None:
    assert HEARTBEAT_SECONDS == 5.0
    assert heartbeat_seconds(1.0) == 5.0 and heartbeat_seconds(10.0) == 10.0
    # Defaults: a 30 s lease is renewed every 10 s, so the row is written every 10 s.
    assert LeaseKeeper(InFlight(), OWNER, lease_seconds=30, cancel_grace=1).heartbeat == 10.0
    assert LeaseKeeper(InFlight(), OWNER, lease_seconds=3, cancel_grace=1).heartbeat == 5.0


def test_the_row_is_written_at_start_then_per_heartbeat_and_deleted_at_stop() -> None:
    store = BeatCounting()
    set_job_store(store)
    manager.new("hb-b")
    manager.new("hb-a")
    thread = keeper(heartbeat=0.3)
    thread.start()
    try:
        deadline = time.monotonic() + 5
        while len(store.beats) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        [listed] = store.workers(utcnow())
        assert (listed.owner, listed.host, listed.pid) == (OWNER, socket.gethostname(), os.getpid())
        assert listed.channels == ("hb-a", "hb-b")
        assert listed.dramatiq_version == dramatiq.__version__
        assert listed.heartbeat == 0.3 and not listed.gone(utcnow())
        assert len(store.beats) >= 3  # at start, then about every 0.3 s
        assert len({beat.started for beat in store.beats}) == 1
        assert listed.last_seen > listed.started
    finally:
        thread.stop()
        thread.join(timeout=5)
    assert not thread.is_alive() and store.forgotten.is_set()
    assert store.workers(utcnow()) == []


def test_a_store_outage_is_logged_once_and_the_keeper_beats_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = BeatCounting(failures=3)
    set_job_store(store)
    thread = keeper(heartbeat=0.2)
    with caplog.at_level(logging.INFO, logger="pypepper_dramatiq"):
        thread.start()
        try:
            deadline = time.monotonic() + 5
            while not store.workers(utcnow()) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert thread.is_alive()
            assert [w.owner for w in store.workers(utcnow())] == [OWNER]
        finally:
            thread.stop()
            thread.join(timeout=5)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "job store" in warnings[0].getMessage()
    assert not any(r.exc_info for r in caplog.records)  # no traceback
