"""The stored form of task parameters: encoded by value, decoded by the annotations.

Property: whatever typed value a parameter holds, what the task receives after
the value was encoded, written as JSON and read back equals it, of its type.
"""

from __future__ import annotations

import enum
import json
import logging
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Optional

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pypepper_dramatiq import Context, PayloadError, Task, workflow_task
from pypepper_dramatiq.records.payloads import (
    UnreadableParams,
    decoder_for,
    encode_params,
    encode_value,
    stored_params,
)
from pypepper_dramatiq.records.spec import TaskSpec

if TYPE_CHECKING:
    from pypepper_dramatiq.model.job import Job  # only for the annotation of ``typed_only``


class Tier(enum.Enum):
    FREE = "free"
    PAID = "paid"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclass(frozen=True)
class Line:
    sku: str
    price: Decimal
    ordered: date


@dataclass
class Node:
    """A dataclass that holds itself."""

    name: str
    children: list[Node] = field(default_factory=list)


@dataclass
class Order:
    id: uuid.UUID
    lines: list[Line]
    tier: Tier = Tier.FREE
    placed: Optional[datetime] = None  # noqa: UP045 - the typing spelling is decoded too
    tags: frozenset[str] = frozenset()
    by_code: dict[str, Decimal] = field(default_factory=dict)


class Address(pydantic.BaseModel):
    street: str
    since: date


def typed(
    task: Task,
    context: Context,
    *,
    order: Order,
    when: datetime,
    amount: Decimal,
    ref: uuid.UUID,
    tier: Tier,
    level: Level,
    at: time,
    day: date | None = None,
    lines: list[Line] | None = None,
    totals: dict[str, Decimal] | None = None,
    pair: tuple[date, Decimal] | None = None,
    tree: Node | None = None,
    counts: dict[int, Decimal] | None = None,
    address: Address | None = None,
    note: str = "",
) -> None:
    """Not called: its signature is what the decoder reads."""


def plain(task: Task, context: Context, *, a: int, b: str = "x", c: Any = None) -> None:
    """Plain JSON parameters."""


def loose(task: Task, context: Context, when: datetime, **rest: Any) -> None:
    """Takes any key."""


def _through_json(params: dict[str, Any]) -> dict[str, Any]:
    """What a reader of the stored row gets: the encoded params, written and read back."""
    loaded: dict[str, Any] = json.loads(json.dumps(encode_params("t", params)))
    return loaded


def _decoded(fn: Any, params: dict[str, Any]) -> dict[str, Any]:
    return decoder_for(fn, f"unit.{fn.__name__}", skip=2).arguments("t", params)


# -- properties -------------------------------------------------------------------------

decimals = st.decimals(allow_nan=False, allow_infinity=False)
aware = st.datetimes(timezones=st.sampled_from([timezone.utc, timezone(timedelta(hours=-5))]))
texts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
lines = st.builds(Line, sku=texts, price=decimals, ordered=st.dates())
orders = st.builds(
    Order,
    id=st.uuids(),
    lines=st.lists(lines, max_size=3),
    tier=st.sampled_from(Tier),
    placed=st.none() | aware | st.datetimes(),
    tags=st.frozensets(texts, max_size=3),
    by_code=st.dictionaries(texts, decimals, max_size=3),
)
nodes = st.recursive(
    st.builds(Node, name=texts),
    lambda kids: st.builds(Node, name=texts, children=st.lists(kids, max_size=3)),
    max_leaves=8,
)


@settings(deadline=None)
@given(
    order=orders,
    when=aware | st.datetimes(),
    amount=decimals,
    ref=st.uuids(),
    tier=st.sampled_from(Tier),
    level=st.sampled_from(Level),
    at=st.times(),
    day=st.none() | st.dates(),
    totals=st.none() | st.dictionaries(texts, decimals, max_size=3),
    pair=st.none() | st.tuples(st.dates(), decimals),
    tree=st.none() | nodes,
    counts=st.none() | st.dictionaries(st.integers(), decimals, max_size=3),
)
def test_typed_values_come_back_equal_and_of_their_types(
    order: Order,
    when: datetime,
    amount: Decimal,
    ref: uuid.UUID,
    tier: Tier,
    level: Level,
    at: time,
    day: date | None,
    totals: dict[str, Decimal] | None,
    pair: tuple[date, Decimal] | None,
    tree: Node | None,
    counts: dict[int, Decimal] | None,
) -> None:
    given_params = {
        "order": order,
        "when": when,
        "amount": amount,
        "ref": ref,
        "tier": tier,
        "level": level,
        "at": at,
        "day": day,
        "totals": totals,
        "pair": pair,
        "tree": tree,
        "counts": counts,
    }
    got = _decoded(typed, _through_json(given_params))
    assert got == given_params
    for key, value in given_params.items():
        assert type(got[key]) is type(value), key
    assert all(type(line.price) is Decimal for line in got["order"].lines)


def takes_all(task: Task, context: Context, **params: Any) -> None:
    """Takes any key, annotated as nothing in particular."""


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | texts,
    lambda inner: st.lists(inner) | st.dictionaries(texts, inner),
    max_leaves=10,
)


@settings(deadline=None)
@given(st.dictionaries(texts, json_values))
def test_plain_json_params_are_stored_and_passed_as_the_same_dict(params: dict[str, Any]) -> None:
    assert encode_params("t", params) is params
    assert _decoded(takes_all, params) is params


# -- the cost of plain parameters -------------------------------------------------------------


def test_a_function_of_plain_parameters_gets_the_stored_dict_itself() -> None:
    stored = {"a": 1, "c": [1, {"x": None}]}
    assert _decoded(plain, stored) is stored
    assert decoder_for(plain, "unit.plain", skip=2) is decoder_for(plain, "unit.plain", skip=2)


def test_the_annotations_are_read_once_per_task(monkeypatch: pytest.MonkeyPatch) -> None:
    def fresh(task: Task, context: Context, *, when: datetime) -> None:
        """A function no decoder was made for yet."""

    reads: list[object] = []
    real = __import__("typing").get_type_hints

    def counting(obj: Any, *args: Any, **kwargs: Any) -> Any:
        reads.append(obj)
        return real(obj, *args, **kwargs)

    monkeypatch.setattr("pypepper_dramatiq.records.payloads.typing.get_type_hints", counting)
    for _ in range(3):
        _decoded(fresh, {"when": "2030-01-01T00:00:00"})
    assert reads == [fresh]


# -- schema evolution -----------------------------------------------------------------------


def test_a_key_the_function_no_longer_takes_is_dropped_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    key = f"gone_{uuid.uuid4().hex[:8]}"
    with caplog.at_level(logging.WARNING, logger="pypepper_dramatiq"):
        for _ in range(3):
            assert _decoded(plain, {"a": 1, key: 2}) == {"a": 1}
    said = [r for r in caplog.records if key in r.getMessage()]
    assert len(said) == 1
    assert said[0].levelno == logging.WARNING and "unit.plain" in said[0].getMessage()


def test_a_function_taking_kwargs_receives_every_stored_key() -> None:
    got = _decoded(loose, {"when": "2030-01-02T03:04:05+00:00", "extra": {"k": 1}})
    assert got == {"when": datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc), "extra": {"k": 1}}


def test_a_missing_parameter_with_a_default_is_left_to_it() -> None:
    assert _decoded(plain, {"a": 5}) == {"a": 5}


@pytest.mark.parametrize(
    ("params", "parameter", "words"),
    [
        ({"b": "x"}, "a", "is missing"),
    ],
)
def test_a_missing_required_parameter_is_named(
    params: dict[str, Any], parameter: str, words: str
) -> None:
    with pytest.raises(PayloadError) as caught:
        _decoded(plain, params)
    assert caught.value.parameter == parameter and words in str(caught.value)
    assert "unit.plain" in str(caught.value)


_GOOD: dict[str, Any] = {
    "order": {"id": str(uuid.uuid4()), "lines": []},
    "when": "2030-01-01T00:00:00",
    "amount": "1.5",
    "ref": str(uuid.uuid4()),
    "tier": "free",
    "level": 1,
    "at": "10:00:00",
}


@pytest.mark.parametrize(
    ("change", "parameter", "words"),
    [
        ({"amount": "one"}, "amount", "not a decimal number"),
        ({"amount": True}, "amount", "not a decimal number"),
        ({"when": "yesterday"}, "when", "not an ISO 8601 datetime"),
        ({"when": 5}, "when", "not an ISO 8601 datetime string"),
        ({"ref": "abc"}, "ref", "not a UUID"),
        ({"tier": "gold"}, "tier", "not a value of Tier ('free', 'paid')"),
        ({"order": "o-1"}, "order", "not an object of Order"),
        ({"order": {"lines": []}}, "order", "has no field 'id'"),
        ({"order": {"id": str(uuid.uuid4()), "lines": [{"sku": "a"}]}}, "order", "'price'"),
        ({"order": {"id": str(uuid.uuid4()), "lines": {}}}, "order", "not a list"),
        ({"pair": ["2030-01-01"]}, "pair", "holds 1 items; 2 are expected"),
        ({"counts": {"one": "1"}}, "counts", "'one', not a whole number"),
        ({"address": {"street": "Main"}}, "address", "not a valid Address (since: Field required)"),
    ],
)
def test_a_value_that_cannot_become_its_type_is_named(
    change: dict[str, Any], parameter: str, words: str
) -> None:
    with pytest.raises(PayloadError) as caught:
        _decoded(typed, {**_GOOD, **change})
    assert caught.value.parameter == parameter
    assert words in str(caught.value), str(caught.value)


def test_a_pydantic_model_is_stored_as_its_json_dump_and_validated_back() -> None:
    given_params = {**_GOOD, "address": Address(street="Main", since=date(2020, 5, 1))}
    stored = _through_json({"address": given_params["address"]})
    assert stored == {"address": {"street": "Main", "since": "2020-05-01"}}
    got = _decoded(typed, {**_GOOD, **stored})
    assert got["address"] == Address(street="Main", since=date(2020, 5, 1))


def test_stored_params_that_are_no_object_are_kept_and_refused() -> None:
    spec = TaskSpec.from_dict({"name": "t", "params": [1, 2]})
    assert isinstance(spec.params, UnreadableParams) and spec.params == {}
    assert spec.to_dict()["params"] == [1, 2]  # written back as it was
    assert stored_params(None) == {}
    with pytest.raises(PayloadError, match=r"its stored params are \[1, 2\] \(a list\)"):
        decoder_for(plain, "unit.plain", skip=2).arguments("t", spec.params)


# -- encoding at the producer ---------------------------------------------------------------


def test_a_value_no_payload_can_hold_is_refused_naming_the_task_and_the_parameter() -> None:
    with pytest.raises(PayloadError) as caught:
        encode_params("load", {"ok": 1, "conn": {"inner": [object()]}})
    assert isinstance(caught.value, TypeError)
    assert caught.value.parameter == "conn"
    assert "params of task 'load': parameter 'conn' at conn['inner'][0] holds a value of type" in (
        str(caught.value)
    )


def test_keys_of_a_dict_must_encode_to_strings() -> None:
    assert encode_value({Tier.PAID: 1, uuid.UUID(int=1): 2}) == {
        "paid": 1,
        str(uuid.UUID(int=1)): 2,
    }
    with pytest.raises(PayloadError, match="not a string"):
        encode_params("t", {"m": {(1, 2): "x"}})


@workflow_task(name="unit-payloads.stored")
def stored_task(task: Task, context: Context, *, when: datetime) -> datetime:
    return when


def test_a_stored_task_holds_its_params_in_their_stored_form() -> None:
    when = datetime(2030, 1, 1, tzinfo=timezone.utc)
    task = stored_task.task(when=when)
    assert task.params == {"when": "2030-01-01T00:00:00+00:00"}
    assert task.executor.execute(task, task.context) == when


def test_without_pydantic_dataclasses_still_work_and_pydantic_is_not_imported() -> None:
    code = """
import sys
sys.modules["pydantic"] = None  # any import of it fails
from dataclasses import dataclass
from datetime import date
from pypepper_dramatiq.records.payloads import decoder_for, encode_params

@dataclass
class D:
    day: date

def fn(task, context, d: D):
    pass

stored = encode_params("t", {"d": D(date(2030, 1, 1))})
assert stored == {"d": {"day": "2030-01-01"}}, stored
assert decoder_for(fn, "t", 2).arguments("t", stored) == {"d": D(date(2030, 1, 1))}
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


@workflow_task(name="unit-payloads.billing.charge")
def charge(task: Task, context: Context, *, amount: Decimal) -> str:
    return f"{amount!r}"


#: The id the function had before it moved: registered too while stored jobs name it.
charge_by_old_name = workflow_task(name="unit-payloads.charge")(charge.fn)


def test_a_moved_task_registered_under_its_old_id_too_runs_jobs_stored_with_either() -> None:
    for stored_id in ("unit-payloads.charge", "unit-payloads.billing.charge"):
        task = Task.from_dict(
            {"name": "charge", "executor_id": stored_id, "params": {"amount": "2.50"}}
        )
        assert task.executor.execute(task, task.context) == "Decimal('2.50')"


def typed_only(task: Job, context: Job, *, when: datetime, later: Job | None = None) -> None:
    """Annotations naming what is imported only for type checkers (``Job``)."""


def test_a_parameter_annotated_with_what_only_type_checkers_import_is_passed_as_stored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="pypepper_dramatiq"):
        got = _decoded(typed_only, {"when": "2030-01-01T00:00:00", "later": "x"})
    # The others are still decoded: ``task`` and ``context`` are not the task's to read.
    assert got == {"when": datetime(2030, 1, 1), "later": "x"}
    said = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert len(said) == 1 and "'later'" in said[0], said
