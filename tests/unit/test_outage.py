"""Outages are logged once, reminded once a minute, and their end said once."""

from __future__ import annotations

import logging
import time
from datetime import datetime

import pytest
from dramatiq.brokers.stub import StubBroker

from pypepper_dramatiq import StoreUnavailableError, set_job_store
from pypepper_dramatiq.drivers.dramatiq.recovery import RecoverySweeper
from pypepper_dramatiq.ops.outage import OutageLog, broker_unreachable
from pypepper_dramatiq.stores.base import JobRecord
from pypepper_dramatiq.stores.memory import MemoryJobStore


def test_an_outage_is_one_warning_then_reminders_then_one_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("tests.outage")
    outage = OutageLog(logger, "job store (test)", reminder_seconds=0.2)
    with caplog.at_level(logging.DEBUG, logger="tests.outage"):
        outage.ok()  # nothing to say while all is well
        for _ in range(50):
            outage.failed(ConnectionError("refused"))
        assert outage.down
        assert [r.levelno for r in caplog.records] == [logging.WARNING]
        assert "job store (test) unreachable: refused" in caplog.text
        time.sleep(0.25)
        outage.failed(ConnectionError("refused"))
        assert "still unreachable after" in caplog.records[-1].getMessage()
        assert "(51 failed calls)" in caplog.records[-1].getMessage()
        outage.ok()
        outage.ok()
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.WARNING, logging.INFO]
    assert "is back after" in caplog.records[-1].getMessage()
    assert not outage.down
    assert not any(r.exc_info for r in caplog.records)


class DownStore(MemoryJobStore):
    def recover_expired(
        self, now: datetime, lease_until: datetime, limit: int = 100
    ) -> list[JobRecord]:
        raise StoreUnavailableError("job store unavailable, connection refused")


def test_the_recovery_sweep_logs_a_store_outage_once_without_tracebacks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    set_job_store(DownStore())
    sweeper = RecoverySweeper(StubBroker(), "me", lease_seconds=1, interval=0.1)
    with caplog.at_level(logging.DEBUG, logger="pypepper_dramatiq"):
        for _ in range(20):
            sweeper.run_once()
        set_job_store(MemoryJobStore())
        sweeper.run_once()
    lines = [r for r in caplog.records if r.name == "pypepper_dramatiq.ops.outage"]
    assert [r.levelno for r in lines] == [logging.WARNING, logging.INFO], caplog.text
    assert not any(r.exc_info for r in lines)


@pytest.mark.parametrize(
    ("exc", "unreachable"),
    [
        (ConnectionRefusedError(), True),
        (TimeoutError(), True),
        (ValueError("bug"), False),
        (KeyError("x"), False),
    ],
)
def test_broker_unreachable_tells_outages_from_bugs(exc: Exception, unreachable: bool) -> None:
    assert broker_unreachable(exc) is unreachable


def _raise(exc: Exception) -> Exception:
    try:
        raise exc
    except Exception as raised:
        return raised


def test_a_failing_part_is_logged_with_its_traceback_once_per_cause(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("tests.outage")
    duty = OutageLog(logger, "duty x", state="failing", per_cause=True)
    with caplog.at_level(logging.DEBUG, logger="tests.outage"):
        for n in range(3):  # one place, one type: one cause whatever the message says
            duty.failed(_raise(ValueError(f"row {n}")))
        duty.failed(_raise(KeyError("elsewhere")))
        duty.ok()
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert lines[:2] == [
        (logging.WARNING, "duty x failing: row 0"),
        (logging.WARNING, "duty x failing: 'elsewhere'"),
    ]
    assert lines[2][0] == logging.INFO and lines[2][1].startswith("duty x is back after")
    assert lines[2][1].endswith("(4 failed calls)") and len(lines) == 3
    assert all(r.exc_info for r in caplog.records[:2])
