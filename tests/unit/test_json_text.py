"""``storable.json_text``: the JSON text the stores write, read back as it was given.

The stores' contract (``tests/stores/test_store_json_numbers_contract.py``) shows
why on PostgreSQL; here, on any value: the text reads back to an equal value of the
same types, and no number in it keeps a positive exponent (which ``jsonb`` would
read back as an int).
"""

from __future__ import annotations

import json
import re
from typing import Any

from hypothesis import assume, given
from hypothesis import strategies as st

from pypepper_dramatiq.limits.storable import checked_json_text, json_text
from pypepper_dramatiq.records.record import JobRecord
from pypepper_dramatiq.records.storable_job import check_job_record
from pypepper_dramatiq.stores.sql.mapping import (
    pg_insert_params,
    pg_insert_rows,
    pg_params,
    row_values,
)

#: Any JSON value, floats of every magnitude and strings that look like numbers included.
VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
    | st.sampled_from(["1e+16", 'a"e+5', "\\", "9e+99"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


def _typed(value: Any) -> Any:
    """``value`` with each scalar paired with its type, so equality also compares types."""
    if isinstance(value, list):
        return [_typed(item) for item in value]
    if isinstance(value, dict):
        return {key: _typed(item) for key, item in value.items()}
    return (type(value).__name__, value)


def _numbers_outside_strings(text: str) -> list[str]:
    without_strings = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)
    return re.findall(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?", without_strings)


@given(VALUES)
def test_the_text_reads_back_as_the_value_with_its_types(value: Any) -> None:
    assert _typed(json.loads(json_text(value))) == _typed(value)


@given(VALUES)
def test_no_number_keeps_a_positive_exponent(value: Any) -> None:
    assert [n for n in _numbers_outside_strings(json_text(value)) if "e+" in n.lower()] == []


def test_a_large_float_is_spelled_out_with_a_fraction_and_strings_are_left_alone() -> None:
    assert json_text(8.850783147909827e16) == "88507831479098270.0"
    assert (
        json_text({"1e+16": "2e+5", "n": -1.5e17})
        == '{"1e+16": "2e+5", "n": -150000000000000000.0}'
    )
    assert json_text([1e-07, 2**70]) == "[1e-07, 1180591620717411303424]"


# -- the payload's text, kept from its check for the store -----------------------------


@given(VALUES)
def test_the_checks_text_reads_back_as_the_stores_text(value: Any) -> None:
    try:
        text = checked_json_text("value", value)
    except ValueError:
        assume(False)  # a value no store keeps (a NUL, a lone surrogate)
        return

    assert json.loads(text) == json.loads(json_text(value))
    assert not re.search(r"\d[eE]\+", re.sub(r'"(?:[^"\\]|\\.)*"', "", text))


def _checked(payload: dict[str, Any]) -> JobRecord:
    return check_job_record(JobRecord(id="job-1", payload=payload))


def test_the_check_keeps_the_text_the_store_would_write() -> None:
    payload = {"n": 8.850783147909827e16, "s": "caf\u00e9", "t": [1, None, True]}

    record = _checked(payload)

    text = record.payload_text()
    assert text is not None
    assert json.loads(text) == json.loads(json_text(payload))
    assert pg_insert_params(record)["payload"] == text  # the store writes it as made
    assert "e+" not in text  # the exponent spelled out, as json_text does


def test_a_copy_keeping_the_payload_keeps_its_text() -> None:
    record = _checked({"a": 1})

    copy = record.with_state({"cursor": [0, 0]})

    assert copy.payload_text() == record.payload_text()


def test_a_record_holding_another_payload_does_not_take_the_kept_text() -> None:
    record = _checked({"a": 1})
    # A copy of the fields (as with_state makes) whose payload is then another one.
    other = record.with_state({})
    object.__setattr__(other, "payload", {"b": 2})
    evolved = record.evolve(payload={"c": 3})

    assert other.payload_text() is None
    assert json.loads(pg_insert_params(other)["payload"]) == {"b": 2}
    assert evolved.payload_text() is None
    assert json.loads(pg_params(evolved)["payload"]) == {"c": 3}


def test_a_record_never_checked_is_encoded_by_the_store() -> None:
    record = JobRecord(id="job-1", payload={"s": "caf\u00e9"})

    assert record.payload_text() is None
    assert pg_insert_params(record)["payload"] == json_text({"s": "caf\u00e9"})


def test_a_batchs_rows_carry_each_kept_text_as_the_row_would() -> None:
    """``put_many`` on PostgreSQL: a checked record's payload goes in as its kept text;
    read as JSON, the rows are the rows as before (each column, times as text)."""
    checked = _checked({"s": "caf\u00e9", "n": 1e16})
    plain = JobRecord(id="job-2", payload={"t": [1, 2]})
    bare = JobRecord(id="job-3")

    text = pg_insert_rows([checked, plain, bare])
    rows = json.loads(text)

    kept = checked.payload_text()
    assert kept is not None and kept in text  # as kept (json_text escapes the é)

    expected = []
    for record in (checked, plain, bare):
        row = row_values(record)
        for name, value in row.items():
            if hasattr(value, "isoformat"):
                row[name] = value.isoformat()
        expected.append(row)
    assert rows == json.loads(json.dumps(expected))
    assert isinstance(rows[0]["payload"]["n"], float)  # spelled out: no exponent
