"""The column limits have one definition (``storable``), which the schema uses; and
``check_json`` names where in a value the part no store keeps sits. (What the job
row cannot hold is refused on every store: ``tests/stores/test_submit_limits_stores.py``.)"""

from __future__ import annotations

import math
from typing import Any

import pytest

from pypepper_dramatiq.limits import storable as limits
from pypepper_dramatiq.limits.storable import check_json
from pypepper_dramatiq.stores import schema

# -- the column limits: one definition --------------------------------------------------------


def test_the_schema_takes_its_lengths_from_storable() -> None:
    columns = {
        schema.jobs.c.id: limits.ID_LENGTH,
        schema.jobs.c.channel_id: limits.CHANNEL_ID_LENGTH,
        schema.jobs.c.category: limits.CATEGORY_LENGTH,
        schema.jobs.c.unique_key: limits.UNIQUE_KEY_LENGTH,
        schema.jobs.c.lease_owner: limits.LEASE_OWNER_LENGTH,
        schema.recurring.c.name: limits.SCHEDULE_NAME_LENGTH,
        schema.recurring.c.cron: limits.CRON_LENGTH,
        schema.recurring.c.timezone: limits.TIMEZONE_LENGTH,
        schema.recurring.c.last_job_id: limits.ID_LENGTH,
        schema.links.c.parent_id: limits.ID_LENGTH,
        schema.workers.c.owner: limits.LEASE_OWNER_LENGTH,
    }
    for column, length in columns.items():
        assert column.type.length == length, column  # type: ignore[attr-defined]
    # The values the migrations created: the constants change no schema.
    assert (limits.ID_LENGTH, limits.CHANNEL_ID_LENGTH, limits.UNIQUE_KEY_LENGTH) == (64, 128, 191)
    assert (limits.SCHEDULE_NAME_LENGTH, limits.CRON_LENGTH, limits.TIMEZONE_LENGTH) == (
        128,
        255,
        64,
    )


# -- check_json ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({"a": "x\x00"}, r"^p\['a'\] holds U\+0000"),
        ({"a\x00": 1}, r"^the key 'a\\x00' of p holds U\+0000"),
        ([1, {"b": [math.nan]}], r"^p\[1\]\['b'\]\[0\] is nan"),
        ({"s": {1, 2}}, r"^p\['s'\] holds a set"),
        ({(1, 2): "t"}, r"^p has a key of type tuple"),
        ({"o": object()}, r"^p\['o'\] holds a object"),
    ],
    ids=["nul", "nul-key", "nan", "set", "tuple-key", "object"],
)
def test_check_json_names_where_the_culprit_sits(value: object, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        check_json("p", value)


def test_check_json_lets_json_through_unchanged() -> None:
    value = {"text": "a\\u0000 written out", "n": [1, 2.5, None, True], "k": {"é": "中"}}
    assert check_json("p", value) is value
    brackets = {"s": "[[[[{{{{" * 10, "list": [[[1]]]}  # brackets in strings do not nest
    assert check_json("p", brackets) is brackets


def nested(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


def test_check_json_refuses_what_nests_deeper_than_a_json_column_holds() -> None:
    assert limits.JSON_DEPTH == 31  # MariaDB's JSON_VALID: a document of 32 levels is refused
    assert check_json("p", nested(31)) is not None
    assert check_json("p", nested(28), depth=3) is not None
    for value, depth in ((nested(32), 0), (nested(29), 3), ({"a": nested(31)}, 0)):
        with pytest.raises(ValueError, match=r"^p.* is nested too deep: .* at most 31 levels"):
            check_json("p", value, depth=depth)
    # Far too deep for json.dumps itself (a RecursionError): named all the same.
    with pytest.raises(ValueError, match="is nested too deep"):
        check_json("p", nested(5000))
