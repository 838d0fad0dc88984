"""The retry table as pure rules: ``first_step`` / ``next_step`` over a plan of policies."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pypepper_dramatiq.rules.steps import (
    Action,
    Position,
    RetryPolicy,
    Step,
    first_step,
    max_attempts,
    next_step,
)

Plan = Sequence[Sequence[RetryPolicy]]


def drive(
    plan: Plan, succeeds: Callable[[Position], bool], *, limit: int = 100_000
) -> tuple[list[Step], Step]:
    """Follow the rules from the first step; returns every RUN step taken and the final step."""
    runs: list[Step] = []
    step = first_step(plan)
    while step.action is Action.RUN:
        assert step.position is not None
        runs.append(step)
        assert len(runs) <= limit, "the rules never stop"
        step = next_step(plan, step.position, succeeds(step.position))
    return runs, step


def fail_first(n: int) -> Callable[[Position], bool]:
    """An outcome function: the first ``n`` attempts (of any task) fail, then all succeed."""
    seen = [0]

    def outcome(_: Position) -> bool:
        seen[0] += 1
        return seen[0] > n

    return outcome


def always_fail(_: Position) -> bool:
    return False


def single(policy: RetryPolicy) -> Plan:
    return [[policy]]


# -- retry_count / retry_delay ----------------------------------------------------------------


@pytest.mark.parametrize("retry_count", [0, 1, 2, 5])
def test_retry_count_allows_count_plus_one_attempts_per_round(retry_count: int) -> None:
    policy = RetryPolicy(retry_count=retry_count)
    assert policy.attempts_per_round == retry_count + 1
    runs, final = drive(single(policy), always_fail)
    assert len(runs) == retry_count + 1
    assert [s.position.attempt for s in runs if s.position] == list(range(retry_count + 1))
    assert final.action is Action.FAIL


def test_retry_delay_is_returned_between_failures() -> None:
    policy = RetryPolicy(retry_count=3, retry_delay=1.5)
    runs, final = drive(single(policy), always_fail)
    assert [s.delay for s in runs] == [0.0, 1.5, 1.5, 1.5]
    assert final.action is Action.FAIL


def test_retry_delay_is_not_applied_after_a_success() -> None:
    slow = RetryPolicy(retry_count=3, retry_delay=7)
    plan = [[slow, slow]]
    step = next_step(plan, Position(0, 0), True)
    assert step.action is Action.RUN
    assert step.position == Position(0, 1)
    assert step.delay == 0
    final = next_step(plan, Position(0, 1), True)
    assert final.action is Action.COMPLETE
    assert final.delay == 0


def test_success_after_failures_moves_on_after_count_of_attempts() -> None:
    policy = RetryPolicy(retry_count=4, retry_delay=0.25)
    runs, final = drive(single(policy), fail_first(2))
    assert len(runs) == 3
    assert final.action is Action.COMPLETE
    assert not final.skipped_optional


# -- retry_until_completed ----------------------------------------------------------------------


def test_until_with_zero_count_uses_retry_until_max_default_1000() -> None:
    policy = RetryPolicy(retry_until_completed=True)
    assert policy.retry_until_max == 1000
    assert policy.attempts_per_round == 1000
    runs, final = drive(single(policy), always_fail)
    assert len(runs) == 1000
    assert final.action is Action.FAIL


def test_until_with_zero_count_retries_until_success() -> None:
    policy = RetryPolicy(retry_until_completed=True, retry_delay=0.5)
    runs, final = drive(single(policy), fail_first(400))
    assert len(runs) == 401
    assert final.action is Action.COMPLETE
    # The delay sits between failures, never before the first attempt.
    assert runs[0].delay == 0
    assert all(s.delay == 0.5 for s in runs[1:])


@pytest.mark.parametrize("until_max", [1, 3, 7])
def test_until_with_zero_count_caps_a_round_at_retry_until_max(until_max: int) -> None:
    policy = RetryPolicy(retry_until_completed=True, retry_until_max=until_max)
    runs, final = drive(single(policy), always_fail)
    assert len(runs) == until_max
    assert final.action is Action.FAIL


@pytest.mark.parametrize("until_max", [1, 2, 50, 1000])
def test_until_with_positive_count_is_capped_by_count_and_ignores_until_max(
    until_max: int,
) -> None:
    policy = RetryPolicy(retry_count=3, retry_until_completed=True, retry_until_max=until_max)
    assert policy.attempts_per_round == 4
    runs, final = drive(single(policy), always_fail)
    assert len(runs) == 4
    assert final.action is Action.FAIL


def test_retry_until_max_is_ignored_without_until() -> None:
    policy = RetryPolicy(retry_count=0, retry_until_max=9)
    runs, _ = drive(single(policy), always_fail)
    assert len(runs) == 1


def test_retry_until_max_is_per_round_not_global() -> None:
    policy = RetryPolicy(retry_until_completed=True, retry_until_max=3, round_times=4)
    runs, final = drive(single(policy), always_fail)
    assert len(runs) == 12
    per_round = Counter(s.position.round for s in runs if s.position)
    assert per_round == {0: 3, 1: 3, 2: 3, 3: 3}
    assert final.action is Action.FAIL


# -- round_times ----------------------------------------------------------------------------


def test_each_round_gets_a_fresh_budget_and_no_delay_between_rounds() -> None:
    policy = RetryPolicy(retry_count=1, retry_delay=2.0, round_times=3)
    runs, final = drive(single(policy), always_fail)
    assert [(s.position.round, s.position.attempt) for s in runs if s.position] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
        (2, 0),
        (2, 1),
    ]
    # Delay between failures inside a round; none when a new round starts.
    assert [s.delay for s in runs] == [0.0, 2.0, 0.0, 2.0, 0.0, 2.0]
    assert final.action is Action.FAIL


def test_new_round_step_has_zero_delay() -> None:
    policy = RetryPolicy(retry_count=2, retry_delay=9, round_times=2)
    step = next_step(single(policy), Position(0, 0, 0, 2), False)
    assert step.action is Action.RUN
    assert step.position == Position(0, 0, 1, 0)
    assert step.delay == 0


def test_success_returns_early_and_later_rounds_never_run() -> None:
    policy = RetryPolicy(retry_count=1, round_times=5)
    runs, final = drive(single(policy), fail_first(3))
    assert len(runs) == 4
    assert max(s.position.round for s in runs if s.position) == 1
    assert final.action is Action.COMPLETE


def test_success_on_first_attempt_uses_one_attempt_whatever_the_rounds() -> None:
    policy = RetryPolicy(retry_count=3, round_times=4, retry_until_completed=True)
    runs, final = drive(single(policy), lambda _: True)
    assert len(runs) == 1
    assert final.action is Action.COMPLETE


# -- optional / required / cancel -----------------------------------------------------------


def test_optional_task_failing_for_good_moves_on_to_the_next_task() -> None:
    plan = [[RetryPolicy(retry_count=1, optional=True), RetryPolicy()]]
    step = next_step(plan, Position(0, 0, 0, 1), False)
    assert step.action is Action.RUN
    assert step.position == Position(0, 1)
    assert step.skipped_optional
    assert step.delay == 0


def test_optional_last_task_failing_for_good_completes() -> None:
    plan = [[RetryPolicy(), RetryPolicy(optional=True, round_times=2)]]
    runs, final = drive(plan, lambda p: p.task == 0)
    assert len(runs) == 3
    assert final.action is Action.COMPLETE
    assert final.skipped_optional


def test_optional_task_failing_moves_on_to_the_next_workflow() -> None:
    plan = [[RetryPolicy(optional=True)], [RetryPolicy()]]
    runs, final = drive(plan, lambda p: p.workflow == 1)
    assert [s.position for s in runs] == [Position(0, 0), Position(1, 0)]
    assert runs[1].skipped_optional
    assert final.action is Action.COMPLETE


def test_required_task_failing_for_good_fails_and_later_tasks_never_run() -> None:
    plan = [[RetryPolicy(retry_count=1, round_times=2), RetryPolicy()], [RetryPolicy()]]
    runs, final = drive(plan, always_fail)
    assert {s.position.key() for s in runs if s.position} == {"0.0"}
    assert len(runs) == 4
    assert final.action is Action.FAIL
    assert final.position == Position(0, 0, 1, 1)


def test_a_failure_with_budget_left_is_not_skipped_even_when_optional() -> None:
    plan = [[RetryPolicy(retry_count=1, optional=True), RetryPolicy()]]
    step = next_step(plan, Position(0, 0, 0, 0), False)
    assert step.position == Position(0, 0, 0, 1)
    assert not step.skipped_optional


# -- non-retriable failures --------------------------------------------------------------------


@pytest.mark.parametrize("at", [Position(0, 0, 0, 0), Position(0, 0, 1, 2)])
def test_a_non_retriable_failure_of_a_required_task_fails_at_once(at: Position) -> None:
    plan = [[RetryPolicy(retry_count=5, round_times=3), RetryPolicy()]]
    step = next_step(plan, at, False, retriable=False)
    assert step.action is Action.FAIL
    assert step.position == at


def test_a_non_retriable_failure_of_an_optional_task_skips_it_at_once() -> None:
    plan = [[RetryPolicy(retry_until_completed=True, optional=True), RetryPolicy()]]
    step = next_step(plan, Position(0, 0, 0, 0), False, retriable=False)
    assert step.action is Action.RUN
    assert step.position == Position(0, 1)
    assert step.skipped_optional and step.delay == 0


def test_retriable_only_matters_for_failures_and_cancel_still_wins() -> None:
    plan = [[RetryPolicy(retry_count=2), RetryPolicy()]]
    assert next_step(plan, Position(0, 0), True, retriable=False) == Step(
        Action.RUN, Position(0, 1)
    )
    assert next_step(plan, Position(0, 0), False, retriable=False, cancelled=True).action is (
        Action.CANCEL
    )


@pytest.mark.parametrize("succeeded", [True, False])
def test_cancelled_wins_over_everything(succeeded: bool) -> None:
    plan = [[RetryPolicy(retry_count=3), RetryPolicy()]]
    step = next_step(plan, Position(0, 0), succeeded, cancelled=True)
    assert step.action is Action.CANCEL


def test_first_step_of_a_cancelled_job_is_cancel() -> None:
    assert first_step([[RetryPolicy()]], cancelled=True).action is Action.CANCEL
    assert first_step([[RetryPolicy()]]).action is Action.RUN


# -- plan shapes ----------------------------------------------------------------------------


def test_empty_workflows_are_skipped() -> None:
    p = RetryPolicy()
    plan: Plan = [[], [p], [], [], [p, p], []]
    runs, final = drive(plan, lambda _: True)
    assert [s.position for s in runs] == [Position(1, 0), Position(4, 0), Position(4, 1)]
    assert final.action is Action.COMPLETE


@pytest.mark.parametrize("plan", [[], [[]], [[], [], []]])
def test_empty_plan_completes(plan: Plan) -> None:
    step = first_step(plan)
    assert step.action is Action.COMPLETE
    assert step.position is None


def test_first_step_starts_at_the_first_attempt() -> None:
    step = first_step([[RetryPolicy(retry_delay=3)]])
    assert step == Step(Action.RUN, Position(0, 0, 0, 0), delay=0.0)


def test_position_list_roundtrip_and_key() -> None:
    pos = Position(2, 3, 1, 4)
    assert Position.from_list(pos.to_list()) == pos
    assert pos.to_list() == [2, 3, 1, 4]
    assert pos.key() == "2.3"


# -- RetryPolicy bounds ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"retry_count": -1},
        {"retry_delay": -0.01},
        {"retry_until_max": 0},
        {"retry_until_max": -5},
        {"round_times": 0},
        {"round_times": -1},
    ],
)
def test_retry_policy_rejects_out_of_range_bounds(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_retry_policy_rejects_nan_delay() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(retry_delay=float("nan"))


def test_retry_policy_accepts_the_boundary_values() -> None:
    policy = RetryPolicy(retry_count=0, retry_delay=0, retry_until_max=1, round_times=1)
    assert policy.attempts_per_round == 1
    assert max_attempts(policy) == 1


def test_max_attempts_is_per_round_times_rounds() -> None:
    assert max_attempts(RetryPolicy(retry_count=2, round_times=3)) == 9
    until = RetryPolicy(retry_until_completed=True, retry_until_max=4, round_times=2)
    assert max_attempts(until) == 8
    assert max_attempts(RetryPolicy(retry_count=1, retry_until_completed=True, round_times=2)) == 4


# -- properties -----------------------------------------------------------------------------

policies = st.builds(
    RetryPolicy,
    retry_count=st.integers(0, 4),
    retry_delay=st.sampled_from([0, 0.5, 2.0]),
    retry_until_completed=st.booleans(),
    retry_until_max=st.integers(1, 6),
    round_times=st.integers(1, 4),
    optional=st.booleans(),
)
plans = st.lists(st.lists(policies, max_size=3), max_size=3)


def expected_attempts_per_round(policy: RetryPolicy) -> int:
    """The seed's table, written out independently of the implementation."""
    if policy.retry_until_completed and policy.retry_count == 0:
        return policy.retry_until_max
    return policy.retry_count + 1


@settings(max_examples=200, deadline=None)
@given(plan=plans, data=st.data())
def test_property_budgets_are_never_exceeded_and_positions_move_forward(
    plan: Plan, data: st.DataObject
) -> None:
    outcome = data.draw(st.lists(st.booleans(), min_size=0, max_size=200), label="outcomes")
    stream = iter(outcome)

    def succeeds(_: Position) -> bool:
        return next(stream, False)

    runs, final = drive(plan, succeeds, limit=10_000)
    positions = [s.position for s in runs if s.position is not None]
    keys = [tuple(p.to_list()) for p in positions]
    assert keys == sorted(keys)
    assert len(set(keys)) == len(keys)

    per_round = Counter((p.workflow, p.task, p.round) for p in positions)
    per_task = Counter((p.workflow, p.task) for p in positions)
    for (w, t, r), count in per_round.items():
        policy = plan[w][t]
        assert count <= expected_attempts_per_round(policy)
        assert r < policy.round_times
    for (w, t), count in per_task.items():
        assert count <= max_attempts(plan[w][t])
        assert count <= expected_attempts_per_round(plan[w][t]) * plan[w][t].round_times

    # A delay appears only on a retry inside the same round.
    previous: Position | None = None
    for step in runs:
        assert step.position is not None
        same_round = (
            previous is not None
            and previous.key() == step.position.key()
            and previous.round == step.position.round
        )
        policy = plan[step.position.workflow][step.position.task]
        assert step.delay == (float(policy.retry_delay) if same_round else 0.0)
        previous = step.position

    assert final.action in (Action.COMPLETE, Action.FAIL)
    if final.action is Action.FAIL:
        assert final.position is not None
        failed = plan[final.position.workflow][final.position.task]
        assert not failed.optional
        assert per_task[(final.position.workflow, final.position.task)] == max_attempts(failed)


@settings(max_examples=200, deadline=None)
@given(plan=plans)
def test_property_always_failing_tasks_get_exactly_their_full_budget(plan: Plan) -> None:
    runs, final = drive(plan, always_fail, limit=10_000)
    per_task = Counter(s.position.key() for s in runs if s.position)

    expected: dict[str, int] = {}
    failed_at: str | None = None
    for w, workflow in enumerate(plan):
        for t, policy in enumerate(workflow):
            expected[f"{w}.{t}"] = expected_attempts_per_round(policy) * policy.round_times
            if not policy.optional:
                failed_at = f"{w}.{t}"
                break
        if failed_at is not None:
            break
    assert dict(per_task) == expected
    if failed_at is None:
        assert final.action is Action.COMPLETE
    else:
        assert final.action is Action.FAIL
        assert final.position is not None
        assert final.position.key() == failed_at


@settings(max_examples=200, deadline=None)
@given(policy=policies, failures=st.integers(0, 40))
def test_property_single_task_attempts_match_the_table(policy: RetryPolicy, failures: int) -> None:
    runs, final = drive(single(policy), fail_first(failures))
    budget = expected_attempts_per_round(policy) * policy.round_times
    if failures < budget:
        assert len(runs) == failures + 1
        assert final.action is Action.COMPLETE
    else:
        assert len(runs) == budget
        assert final.action is (Action.COMPLETE if policy.optional else Action.FAIL)
        assert final.skipped_optional is policy.optional
