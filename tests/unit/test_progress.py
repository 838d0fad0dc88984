"""A task's progress, without a driver: values checked, writes throttled, the last one kept."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import pytest

from pypepper_dramatiq import Context
from pypepper_dramatiq.records.progress import ProgressBar, ProgressReporter, check
from pypepper_dramatiq.records.record import JobRecord


class Sink:
    """Records every write (key, entry), and can wait for the next one."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, dict[str, Any]]] = []
        self.written = threading.Event()

    def __call__(self, key: str, value: dict[str, Any]) -> None:
        self.writes.append((key, value))
        self.written.set()


@pytest.mark.parametrize(
    ("done", "total", "failed", "note", "named"),
    [
        (-1, None, 0, None, "done"),
        ("3", None, 0, None, "done"),
        (True, None, 0, None, "done"),
        (math.nan, None, 0, None, "done"),
        (math.inf, None, 0, None, "done"),
        (1, -5, 0, None, "total"),
        (1, "10", 0, None, "total"),
        (11, 10, 0, None, "beyond total"),
        (1, 10, 2, None, "failed"),
        (1, 10, -1, None, "failed"),
        (1, 10, 0, 42, "note"),
    ],
)
def test_bad_values_are_value_errors_naming_the_culprit(
    done: Any, total: Any, failed: Any, note: Any, named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        check(done, total, failed, note)


def test_the_first_value_is_written_at_once_and_a_burst_costs_one_more_write() -> None:
    sink = Sink()
    reporter = ProgressReporter("0.1", "fetch", sink=sink, interval=0.3)
    reporter.report(1, 1000)
    assert [key for key, _ in sink.writes] == ["0.1"]
    sink.written.clear()
    for done in range(2, 1001):
        reporter.report(done, 1000, note="going")
    assert len(sink.writes) == 1  # throttled: nothing more within the interval
    assert sink.written.wait(2)  # the trailing write, once the interval has passed
    time.sleep(0.5)
    assert len(sink.writes) == 2
    _, last = sink.writes[-1]
    assert (last["task"], last["done"], last["total"]) == ("fetch", 1000, 1000)
    assert last["note"] == "going"
    assert reporter.writes == 2


def test_close_stops_writing_and_gives_the_last_value_for_the_outcome_write() -> None:
    sink = Sink()
    reporter = ProgressReporter("0.0", "t", sink=sink, interval=0.2)
    reporter.report(1, 3)
    reporter.report(2, 3)  # pending behind the throttle
    last = reporter.close()
    assert last is not None and last["done"] == 2
    time.sleep(0.4)
    assert len(sink.writes) == 1  # the pending write was dropped: the outcome carries it
    reporter.report(3, 3)  # late calls are kept, never written
    assert len(sink.writes) == 1


def test_a_sink_that_fails_never_reaches_the_task() -> None:
    def broken(key: str, value: dict[str, Any]) -> None:
        raise ConnectionError("store down")

    reporter = ProgressReporter("0.0", "t", sink=broken)
    reporter.report(1, 2)
    assert reporter.close() is not None


def test_a_bar_counts_successes_and_failures_and_refuses_to_pass_its_total() -> None:
    reporter = ProgressReporter("0.0", "t")
    bar = ProgressBar(reporter, 5, note="rows")
    bar.succeeded()
    bar.succeeded(2)
    bar.failed()
    latest = reporter.latest
    assert latest is not None
    assert (latest["done"], latest["failed"], latest["total"], latest["note"]) == (4, 1, 5, "rows")
    with pytest.raises(ValueError, match="beyond total"):
        bar.succeeded(2)
    with pytest.raises(ValueError, match="n must be a number"):
        bar.failed("1")  # type: ignore[arg-type]
    assert reporter.latest is not None and reporter.latest["done"] == 4  # unchanged


def test_a_context_outside_a_driver_keeps_its_progress() -> None:
    context = Context()
    context.progress(3, 10, note="warming up")
    bar = context.progress_bar(4)
    bar.succeeded()
    latest = context.progress_reporter.latest
    assert latest is not None and (latest["done"], latest["total"]) == (1, 4)
    with pytest.raises(ValueError):
        context.progress(-1)


def test_a_record_reads_its_progress_by_task_key_with_every_field() -> None:
    record = JobRecord(
        id="j",
        state={"progress": {"0.0": {"task": "fetch", "done": 3, "updated": "2026-01-01T00:00:00"}}},
    )
    assert record.progress == {
        "0.0": {
            "task": "fetch",
            "done": 3,
            "total": None,
            "failed": None,
            "note": None,
            "updated": "2026-01-01T00:00:00",
        }
    }
    assert JobRecord(id="k").progress == {}
