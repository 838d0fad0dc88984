"""The store contract for numbers in JSON: a float comes back a float, an int an int.

PostgreSQL's ``jsonb`` keeps a number as ``numeric``, which prints a float written
with an exponent and no fraction (``8.850783147909827e+16``, Python's form for
floats from 1e16) as an integer: read back, the task parameter or result was an
``int``, not even of the float's exact value. Every store must hand back what it
was given, on every path a JSON column is written by: ``put``, ``put_many``,
``advance``, a progress write. (``-0.0`` is read back as ``0.0`` on PostgreSQL:
``numeric`` has no negative zero; the two are equal.)
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from pypepper_dramatiq.records.progress import entry
from pypepper_dramatiq.records.storable_job import check_job_record
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import IJobStore

from .test_store_contract import MinimalStore, job, store, stored

__all__ = ["store"]  # the fixture: every store of the contract

#: Numbers whose JSON text tempts a store to change their type or value.
NUMBERS: list[Any] = [
    8.850783147909827e16,
    1e16,
    -1.5e17,
    1e300,
    -1.7976931348623157e308,
    5e-324,
    1e-7,
    0.1,
    2**62,
    -(2**53) - 1,
    0,
]


def _same(found: Any, given: Any) -> bool:
    if type(found) is not type(given):
        return False
    if isinstance(given, float):
        return found == given and math.copysign(1.0, found) == math.copysign(1.0, given)
    return bool(found == given)


def _assert_kept(found: list[Any]) -> None:
    changed = [(g, f) for g, f in zip(NUMBERS, found, strict=True) if not _same(f, g)]
    assert changed == [], f"(given, read back): {changed}"


def test_put_keeps_each_number_as_given(store: IJobStore) -> None:
    assert store.put(job(payload={"numbers": NUMBERS}, state={"results": {"t": NUMBERS}}))

    row = stored(store)

    assert row.payload is not None
    _assert_kept(row.payload["numbers"])
    _assert_kept(row.state["results"]["t"])


def test_a_checked_put_keeps_each_value_as_given(store: IJobStore) -> None:
    """``scheduled()`` writes the payload's text its check made (non-ASCII kept as
    it is, not escaped): read back, every value is the one given."""
    texts = ["caf\u00e9", "\u4e2d\u6587", "\U0001f600", 'a "quote" \\ and \u2028']
    record = check_job_record(job(payload={"numbers": NUMBERS, "texts": texts}))
    assert record.payload_text() is not None  # the check kept its text for the store

    assert store.put(record)

    payload = stored(store).payload
    assert payload is not None
    _assert_kept(payload["numbers"])
    assert payload["texts"] == texts


def test_a_checked_put_many_keeps_each_value_as_given(store: IJobStore) -> None:
    """``schedule_many`` writes each payload's text its check made."""
    texts = ["caf\u00e9", "\U0001f600", 'a "quote" \\']
    records = [
        check_job_record(job(f"many-{n}", payload={"numbers": NUMBERS, "texts": texts, "n": n}))
        for n in range(3)
    ]

    store.put_many(records)

    for n in range(3):
        payload = stored(store, f"many-{n}").payload
        assert payload is not None
        _assert_kept(payload["numbers"])
        assert payload["texts"] == texts
        assert payload["n"] == n


def test_put_many_keeps_each_number_as_given(store: IJobStore) -> None:
    store.put_many([job("many-1", payload={"numbers": NUMBERS})])

    payload = stored(store, "many-1").payload

    assert payload is not None
    _assert_kept(payload["numbers"])


def test_advance_keeps_each_number_as_given(store: IJobStore) -> None:
    assert store.put(job(status=Status.IN_PROGRESS))
    row = stored(store)

    assert store.advance(row.evolve(state={"results": {"t": NUMBERS}}))

    _assert_kept(stored(store).state["results"]["t"])


@pytest.mark.parametrize("number", [8.850783147909827e16, 1e300, 0.5])
def test_a_progress_write_keeps_its_numbers_floats(store: IJobStore, number: float) -> None:
    if isinstance(store, MinimalStore):
        pytest.skip("the default write_progress stores nothing until the outcome write")
    assert store.put(job(status=Status.IN_PROGRESS))

    assert store.write_progress("job-1", "0.0", entry("t", done=number, total=1e17))

    kept = stored(store).progress["0.0"]
    assert _same(kept["done"], number)
    assert _same(kept["total"], 1e17)
