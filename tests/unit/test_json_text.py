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

from hypothesis import given
from hypothesis import strategies as st

from pypepper_dramatiq.limits.storable import json_text

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
