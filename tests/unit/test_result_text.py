"""A task's result holding text no store keeps fails its attempt on every store alike.

PostgreSQL and MariaDB refuse a lone surrogate in a JSON document; the memory
store used to keep it, so a job Completed in development and Failed (the store
refusing its outcome write) in production. ``check_storable`` refuses it for
every store, as it refuses a NUL.
"""

from __future__ import annotations

from typing import Any

import pytest

from pypepper_dramatiq.errors import ResultNotStorableError
from pypepper_dramatiq.records.results import check_storable


@pytest.mark.parametrize(
    "value",
    ["lone \udc80", {"k": ["\ud800"]}, {"key \udfff": 1}],
    ids=["text", "nested", "key"],
)
def test_a_lone_surrogate_in_a_result_is_refused_naming_it(value: Any) -> None:
    with pytest.raises(ResultNotStorableError, match=r"task 'load'.*lone surrogate \(U\+D"):
        check_storable("load", value)


@pytest.mark.parametrize(
    "value",
    ["emoji \U0001f600", {"\u202e": "\x1b[2J"}, "a literal \\ud800 escape", ["é", 1, None]],
)
def test_text_every_store_keeps_is_kept_as_it_is(value: Any) -> None:
    assert check_storable("load", value) is value
