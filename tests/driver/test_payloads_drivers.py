"""Typed task parameters and stored payloads across deploys, on both drivers.

A dataclass, a ``datetime`` and a ``Decimal`` parameter arrive as their types;
a row stored by older code (a key the task no longer takes, a key the task
added since with a default) runs; a payload that cannot be decoded fails the
job at once with ``PayloadError``, without calling the task and without a retry.
"""

from __future__ import annotations

import collections
import logging
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import pytest

from pypepper_dramatiq import Context, Job, JobRecord, Status, Task, workflow_task

from .conftest import CHANNEL
from .drivers import Driver, make_job, run

#: Calls of each task body, by job id.
CALLS: collections.Counter[str] = collections.Counter()
#: What each call received, by job id.
RECEIVED: dict[str, dict[str, Any]] = {}
_lock = threading.Lock()

#: The retry table of the tasks here: a failure that was retried would show four attempts.
RETRIES = 3


@dataclass
class Customer:
    name: str
    vip: bool = False


@workflow_task(name="payloads-drivers.invoice", retry_count=RETRIES)
def invoice(
    task: Task,
    context: Context,
    *,
    customer: Customer,
    due: datetime,
    amount: Decimal,
    currency: str = "EUR",
) -> str:
    """Records what it was given, as the types it was given."""
    with _lock:
        CALLS[context.job_id] += 1
        RECEIVED[context.job_id] = {
            "customer": customer,
            "due": due,
            "amount": amount,
            "currency": currency,
        }
    return f"{customer.name}: {amount} {currency}"


def _old_row(params: Any) -> Job:
    """A job whose row older code wrote: its task's params exactly as given (JSON)."""
    task = {
        "name": "invoice",
        "executor_id": "payloads-drivers.invoice",
        "channel_id": CHANNEL,
        "fingerprint": "payloads-drivers.invoice",
        "params": params,
        "retry_count": RETRIES,
    }
    record = JobRecord(
        id=uuid.uuid4().hex,
        channel_id=CHANNEL,
        category="contract",
        payload={"workflows": [{"tasks": [task]}]},
    )
    return Job.from_record(record)


def test_a_dataclass_a_datetime_and_a_decimal_arrive_as_their_types(driver: Driver) -> None:
    due = datetime(2030, 1, 31, 17, 30, tzinfo=timezone.utc)
    job = make_job(
        [
            invoice.task(
                name="invoice",
                customer=Customer("Ada", vip=True),
                due=due,
                amount=Decimal("12.50"),
            )
        ]
    )

    (record,) = run(driver, job)

    assert record.status is Status.COMPLETED, record.error
    got = RECEIVED[job.id]
    assert got["customer"] == Customer("Ada", vip=True)
    assert type(got["customer"]) is Customer
    assert type(got["due"]) is datetime and got["due"] == due
    assert type(got["amount"]) is Decimal and got["amount"] == Decimal("12.50")
    assert record.results_by_name() == {"invoice": "Ada: 12.50 EUR"}
    # The stored form is readable JSON: an object, an ISO string, a decimal string.
    assert record.payload is not None
    stored = record.payload["workflows"][0]["tasks"][0]["params"]
    assert stored == {
        "customer": {"name": "Ada", "vip": True},
        "due": "2030-01-31T17:30:00+00:00",
        "amount": "12.50",
    }


def test_a_row_of_older_code_with_a_dropped_key_and_without_a_new_one_runs(
    driver: Driver, caplog: pytest.LogCaptureFixture
) -> None:
    dropped = f"note_{uuid.uuid4().hex[:8]}"  # logged once per process: a key of its own
    job = _old_row(
        {
            "customer": {"name": "Bob", "phone": "555"},  # a field Customer no longer has
            "due": "2030-02-01T09:00:00Z",
            "amount": "3",
            dropped: "the task had this parameter once",
            # no "currency": the parameter came later, with a default
        }
    )

    with caplog.at_level(logging.WARNING, logger="pypepper_dramatiq"):
        (record,) = run(driver, job)

    assert record.status is Status.COMPLETED, record.error
    assert record.state["attempts"] == {"0.0": 1}
    assert RECEIVED[job.id] == {
        "customer": Customer("Bob"),
        "due": datetime(2030, 2, 1, 9, 0, tzinfo=timezone.utc),
        "amount": Decimal("3"),
        "currency": "EUR",
    }
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    said = [m for m in warnings if repr(dropped) in m]
    assert len(said) == 1, warnings
    assert "payloads-drivers.invoice" in said[0]


@pytest.mark.parametrize(
    ("params", "culprit"),
    [
        pytest.param(
            {"customer": {"name": "Eve"}, "due": "2030-01-01", "amount": "twelve"},
            "parameter 'amount'",
            id="not-a-decimal",
        ),
        pytest.param(
            {"customer": {"name": "Eve"}, "amount": "1"},
            "parameter 'due' is missing",
            id="required-missing",
        ),
        pytest.param(
            {"customer": {"vip": True}, "due": "2030-01-01", "amount": "1"},
            "has no field 'name'",
            id="dataclass-field-missing",
        ),
        pytest.param(["not", "an", "object"], "its stored params are", id="not-an-object"),
    ],
)
def test_an_undecodable_payload_fails_the_job_at_once_without_calling_the_task(
    driver: Driver, params: Any, culprit: str
) -> None:
    job = _old_row(params)

    (record,) = run(driver, job)

    assert record.status is Status.FAILED
    assert CALLS[job.id] == 0
    assert record.state["attempts"] == {"0.0": 1}  # retry_count=3: not one retry
    error = record.error or ""
    assert "PayloadError" in error and "'invoice'" in error and culprit in error, error
    assert "payloads-drivers.invoice" in error
    # The stored payload is left as it was written: nothing lost.
    assert record.payload is not None
    assert record.payload["workflows"][0]["tasks"][0]["params"] == params
