"""Retry backoff: each retry of a round waits longer (exponential, capped, jittered).

The rule is :meth:`RetryPolicy.delay_before`, which :func:`next_step` applies;
the random source of the jitter is a parameter, pinned here.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pypepper_dramatiq import CallableExecutor, RetryPolicy, Task, Workflow, workflow_task
from pypepper_dramatiq.records.spec import TaskSpec
from pypepper_dramatiq.rules import steps as rules
from pypepper_dramatiq.rules.steps import Action, Position, Step, first_step, next_step

#: Timer granularity allowed when asserting that a wait lasted at least its delay.
EPSILON = 0.01


def delays(policy: RetryPolicy, rand: Callable[[], float] = random.random) -> list[float]:
    """The delay of every RUN step of a task that always fails, in order."""
    plan = [[policy]]
    runs: list[Step] = []
    step = first_step(plan)
    while step.action is Action.RUN:
        assert step.position is not None
        runs.append(step)
        step = next_step(plan, step.position, False, rand=rand)
    assert step.action is Action.FAIL
    return [s.delay for s in runs]


def task(**kw: Any) -> Task:
    return Task("c", "dag", "fp", "t", None, "", [], CallableExecutor(lambda t, c: None), **kw)


# -- the rule, by example -------------------------------------------------------------------


def test_each_retry_of_a_round_waits_retry_delay_times_backoff_to_the_n_minus_1() -> None:
    policy = RetryPolicy(retry_count=4, retry_delay=0.5, retry_backoff=2)
    assert delays(policy) == [0.0, 0.5, 1.0, 2.0, 4.0]


def test_a_new_round_starts_at_once_and_backs_off_from_retry_delay_again() -> None:
    policy = RetryPolicy(retry_count=2, retry_delay=1, retry_backoff=3, round_times=2)
    assert delays(policy) == [0.0, 1.0, 3.0, 0.0, 1.0, 3.0]


def test_retry_delay_max_caps_the_wait() -> None:
    policy = RetryPolicy(retry_count=5, retry_delay=1, retry_backoff=2, retry_delay_max=5)
    assert delays(policy) == [0.0, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_retry_until_completed_backs_off_over_its_whole_round() -> None:
    policy = RetryPolicy(
        retry_until_completed=True, retry_until_max=6, retry_delay=0.25, retry_backoff=2
    )
    assert delays(policy) == [0.0, 0.25, 0.5, 1.0, 2.0, 4.0]


def test_jitter_waits_the_part_rand_picks_of_the_capped_delay() -> None:
    policy = RetryPolicy(
        retry_count=4, retry_delay=1, retry_backoff=2, retry_delay_max=4, retry_jitter=True
    )
    assert delays(policy, rand=lambda: 1.0) == [0.0, 1.0, 2.0, 4.0, 4.0]
    assert delays(policy, rand=lambda: 0.0) == [0.0, 0.0, 0.0, 0.0, 0.0]
    assert delays(policy, rand=lambda: 0.25) == [0.0, 0.25, 0.5, 1.0, 1.0]


def test_jitter_spreads_the_retries_of_many_jobs() -> None:
    """A thousand jobs failing together do not retry together (seeded, so repeatable).

    The second retry (after attempt 1 failed) waits a part of 2 * 2 = 4 s.
    """
    policy = RetryPolicy(retry_count=3, retry_delay=2, retry_backoff=2, retry_jitter=True)
    source = random.Random(1234)
    waits = [
        next_step([[policy]], Position(0, 0, 0, 1), False, rand=source.random).delay
        for _ in range(1000)
    ]
    assert all(0.0 <= wait <= 4.0 for wait in waits)
    assert len(set(waits)) > 990
    assert min(waits) < 0.1 and max(waits) > 3.9
    assert 1.8 < sum(waits) / len(waits) < 2.2  # uniform over [0, 4]


def test_jitter_uses_random_random_when_no_source_is_given() -> None:
    policy = RetryPolicy(retry_count=1, retry_delay=3, retry_jitter=True)
    waits = {next_step([[policy]], Position(), False).delay for _ in range(50)}
    assert all(0.0 <= wait <= 3.0 for wait in waits)
    assert len(waits) > 1


def test_the_rand_source_is_only_called_for_jitter() -> None:
    def no_randomness() -> float:
        raise AssertionError("rand called without retry_jitter")

    assert delays(RetryPolicy(retry_count=2, retry_delay=1, retry_backoff=2), no_randomness) == [
        0.0,
        1.0,
        2.0,
    ]


def test_without_a_cap_growth_stops_at_seven_days_but_a_longer_retry_delay_is_kept() -> None:
    grows = RetryPolicy(retry_count=40, retry_delay=60, retry_backoff=10)
    assert grows.delay_before(40) == rules.MAX_BACKOFF_SECONDS == 7 * 24 * 3600
    long = RetryPolicy(retry_count=3, retry_delay=10 * 24 * 3600, retry_backoff=2)
    assert long.delay_before(3) == 10 * 24 * 3600
    capped = RetryPolicy(retry_count=3, retry_delay=1, retry_backoff=1e6, retry_delay_max=1e9)
    assert capped.delay_before(3) == 1e9  # a cap written by the user is kept as written


@pytest.mark.parametrize(
    ("backoff", "attempt", "delay_max"),
    [
        (1e300, 3, None),
        (1e300, 10, 30.0),
        (2, 100_000, None),
        (1.5, 10**18, None),
        (10, 10**30, 3e9),  # near durations.MAX_SECONDS, the longest cap allowed
        (1.0000001, 10**12, None),
    ],
)
def test_a_huge_backoff_never_overflows_and_stays_finite(
    backoff: float, attempt: int, delay_max: float | None
) -> None:
    policy = RetryPolicy(retry_delay=1, retry_backoff=backoff, retry_delay_max=delay_max)
    wait = policy.delay_before(attempt)
    assert math.isfinite(wait)
    assert wait == (rules.MAX_BACKOFF_SECONDS if delay_max is None else delay_max)


def test_a_tiny_delay_whose_power_overflows_is_still_computed_below_the_cap() -> None:
    """10 ** 310 is beyond floats, but 1e-301 * 10 ** 310 = 1e9 is not: no early cap."""
    policy = RetryPolicy(retry_delay=1e-301, retry_backoff=10, retry_delay_max=3e9)
    assert math.isclose(policy.delay_before(311), 1e9, rel_tol=1e-9)
    assert policy.delay_before(400) == 3e9


# -- properties -----------------------------------------------------------------------------

attempts = st.integers(1, 10_000)
seconds = st.one_of(st.integers(0, 3600), st.floats(0, 1e6, allow_nan=False))
backoffs = st.one_of(st.integers(1, 10), st.floats(1, 1e12, allow_nan=False))


@st.composite
def policies(draw: st.DrawFn, jitter: bool = False) -> RetryPolicy:
    delay = draw(seconds)
    cap = draw(st.one_of(st.none(), st.floats(0, 1e7, allow_nan=False).map(lambda c: delay + c)))
    return RetryPolicy(
        retry_delay=delay, retry_backoff=draw(backoffs), retry_delay_max=cap, retry_jitter=jitter
    )


@settings(max_examples=300, deadline=None)
@given(delay=seconds, attempt=st.integers(0, 10**9))
def test_property_the_defaults_wait_the_fixed_retry_delay_before_every_retry(
    delay: float, attempt: int
) -> None:
    policy = RetryPolicy(retry_delay=delay, retry_count=3)
    assert policy.delay_before(attempt) == (float(delay) if attempt > 0 else 0.0)
    assert delays(policy) == [0.0] + [float(delay)] * 3


@settings(max_examples=300, deadline=None)
@given(policy=policies(), attempt=attempts)
def test_property_without_jitter_waits_never_shrink_and_never_pass_the_cap(
    policy: RetryPolicy, attempt: int
) -> None:
    wait, following = policy.delay_before(attempt), policy.delay_before(attempt + 1)
    assert policy.retry_delay <= wait <= following
    limit = policy.retry_delay_max
    if limit is None:
        limit = max(policy.retry_delay, rules.MAX_BACKOFF_SECONDS)
    assert following <= limit
    assert math.isfinite(following)


@settings(max_examples=300, deadline=None)
@given(policy=policies(), attempt=st.integers(1, 60))
def test_property_the_wait_is_retry_delay_times_backoff_power_capped(
    policy: RetryPolicy, attempt: int
) -> None:
    """Written out independently of the implementation, in logarithms (no overflow)."""
    delay, backoff = float(policy.retry_delay), float(policy.retry_backoff)
    limit = policy.retry_delay_max
    if limit is None:
        limit = max(delay, rules.MAX_BACKOFF_SECONDS)
    if delay == 0:
        expected = 0.0
    else:
        log_grown = math.log(delay) + (attempt - 1) * math.log(backoff)
        expected = min(math.exp(min(log_grown, 700.0)), limit)
    assert math.isclose(policy.delay_before(attempt), expected, rel_tol=1e-9)


@settings(max_examples=300, deadline=None)
@given(policy=policies(jitter=True), attempt=attempts, fraction=st.floats(0, 1))
def test_property_jitter_stays_within_zero_and_the_capped_wait(
    policy: RetryPolicy, attempt: int, fraction: float
) -> None:
    plain = RetryPolicy(
        retry_delay=policy.retry_delay,
        retry_backoff=policy.retry_backoff,
        retry_delay_max=policy.retry_delay_max,
    )
    capped = plain.delay_before(attempt)
    assert 0.0 <= policy.delay_before(attempt, lambda: fraction) <= capped
    assert policy.delay_before(attempt, lambda: 1.0) == capped
    assert policy.delay_before(attempt, lambda: 0.0) == 0.0
    assert policy.delay_before(0, lambda: 1.0) == 0.0  # a round's first attempt never waits


# -- bad values -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("retry_backoff", 0.5),
        ("retry_backoff", 0),
        ("retry_backoff", -2),
        ("retry_backoff", float("nan")),
        ("retry_backoff", float("inf")),
        ("retry_delay_max", -1),
        ("retry_delay_max", float("nan")),
        ("retry_delay_max", float("inf")),
        ("retry_delay", float("inf")),
    ],
)
def test_out_of_range_values_are_refused_naming_the_option(option: str, value: float) -> None:
    with pytest.raises(ValueError, match=f"^{option} must be"):
        RetryPolicy(**{option: value})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=f"^{option} must be"):
        task(**{option: value})


def test_a_cap_below_retry_delay_is_refused() -> None:
    with pytest.raises(ValueError, match=r"retry_delay_max \(1\) must not be below retry_delay"):
        RetryPolicy(retry_delay=2, retry_delay_max=1)
    assert RetryPolicy(retry_delay=2, retry_delay_max=2).delay_before(5) == 2.0


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("retry_backoff", "2"),
        ("retry_backoff", True),
        ("retry_backoff", None),
        ("retry_delay_max", "5"),
        ("retry_delay_max", False),
        ("retry_jitter", 1),
        ("retry_jitter", "yes"),
        ("retry_jitter", None),
    ],
)
def test_values_of_the_wrong_type_are_refused_naming_the_option(option: str, value: Any) -> None:
    # "<option> must be": not Python's "unexpected keyword argument '<option>'".
    message = f"^{option} must be"
    with pytest.raises(TypeError, match=message):
        RetryPolicy(**{option: value})
    with pytest.raises(TypeError, match=message):
        task(**{option: value})
    with pytest.raises(TypeError, match=message):
        workflow_task(name="tests.backoff.bad", **{option: value})(lambda t, c: None).task()


# -- Task, @workflow_task, the stored spec --------------------------------------------------


def test_a_task_exposes_its_backoff_options() -> None:
    plain = task()
    assert (plain.retry_backoff, plain.retry_delay_max, plain.retry_jitter) == (1.0, None, False)
    backed = task(retry_delay=0.5, retry_backoff=3, retry_delay_max=10, retry_jitter=True)
    assert (backed.retry_backoff, backed.retry_delay_max, backed.retry_jitter) == (3, 10, True)
    assert backed.policy == RetryPolicy(
        retry_delay=0.5, retry_backoff=3, retry_delay_max=10, retry_jitter=True
    )


def test_workflow_task_takes_the_backoff_options_and_stores_them() -> None:
    @workflow_task(name="tests.backoff.fn", retry_count=3, retry_delay=1, retry_backoff=2)
    def fn(task: Task, context: Any) -> None:
        return None

    made = fn.options(retry_delay_max=3, retry_jitter=True).task()
    assert (made.retry_backoff, made.retry_delay_max, made.retry_jitter) == (2, 3, True)
    stored = made.to_dict()
    assert (stored["retry_backoff"], stored["retry_delay_max"], stored["retry_jitter"]) == (
        2,
        3,
        True,
    )
    rebuilt = TaskSpec.from_dict(stored).policy
    assert [rebuilt.delay_before(n, lambda: 1.0) for n in range(5)] == [0.0, 1.0, 2.0, 3.0, 3.0]
    assert fn.task().retry_jitter is False


def test_workflow_run_waits_the_backed_off_delays() -> None:
    """The seed's Workflow.run obeys the same rule (lower bound only: machines are noisy)."""
    starts: list[float] = []

    def fails(task: Task, context: Any) -> None:
        starts.append(time.monotonic())
        raise RuntimeError("planned failure")

    workflow = Workflow(
        [
            Task(
                "c",
                "dag",
                "fp",
                "t",
                None,
                "",
                [],
                CallableExecutor(fails),
                retry_count=3,
                retry_delay=0.05,
                retry_backoff=2,
            )
        ]
    )
    assert not workflow.run().ok
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    assert len(gaps) == 3
    # A fixed retry_delay would wait 0.05 s each time.
    expected = [0.05, 0.1, 0.2]
    assert all(gap >= wait - EPSILON for gap, wait in zip(gaps, expected, strict=True)), gaps
