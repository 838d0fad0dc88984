"""Recording an attempt's outcome (:mod:`pypepper_dramatiq.engine.outcomes`), over any row.

The decision is pure, so its rules are checked here on their own, with
Hypothesis drawing the plan, the step, the row's earlier state, the outcome
(any text in its error, results no row can store) and the writer's settings:
an ended job never comes back to InProgress, attempts only grow, the attempt's
history entry is appended once, the end of a cancel or a failure is marked counted exactly
when the writer observes, what is written is storable, the effects match the
row, and a write decided again on a row whose hooks moved keeps both sides'.
The shell that writes and performs the effects is tested with real stores in
tests/driver (test_steps.py, test_hook_holds_next_step.py, ...).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pypepper_dramatiq.engine.outcomes import (
    Attempt,
    Notice,
    Outcome,
    Verdict,
    Writer,
    decide,
    interrupted_write,
    next_step_lease,
    only_hooks_moved,
    outcome_write,
)
from pypepper_dramatiq.errors import InvalidTransitionError
from pypepper_dramatiq.limits.storable import unstorable_in
from pypepper_dramatiq.records import history
from pypepper_dramatiq.records.record import JobRecord
from pypepper_dramatiq.records.results import check_storable
from pypepper_dramatiq.records.state import COUNTED_KEY, HOOK_PENDING, HOOKS_KEY, JobState
from pypepper_dramatiq.rules import steps as rules
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.rules.steps import Action, Position, RetryPolicy

#: The retry delay's jitter, fixed: the property is about the row, not the delay.
NO_JITTER = 0.5
ENDED = (Status.COMPLETED, Status.FAILED, Status.CANCELLED)

# -- strategies ------------------------------------------------------------------------------

policies = st.builds(
    RetryPolicy,
    retry_count=st.integers(0, 3),
    retry_delay=st.sampled_from([0, 0.5, 2.0]),
    retry_until_completed=st.booleans(),
    retry_until_max=st.integers(1, 4),
    round_times=st.integers(1, 3),
    optional=st.booleans(),
)
plans = st.lists(st.lists(policies, min_size=1, max_size=3), min_size=1, max_size=3)
times = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(timezone.utc)
)
#: Every code point: NUL, lone surrogates, controls.
any_text = st.text(st.characters(codec=None), max_size=40)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | any_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)
#: Results a row may store and results it may not (NaN, a set, NUL, a surrogate).
results = json_values | st.sampled_from([float("nan"), {1, 2}, "a\x00b", "\udc80", object()])
kinds = st.sampled_from([None, history.FAILED, history.TIMED_OUT, history.SUCCEEDED])
writers = st.builds(
    Writer,
    owner=st.text("abcdef0123456789-", min_size=1, max_size=12),
    lease_seconds=st.floats(1, 3600),
    dispatch_seconds=st.floats(1, 7200),
    holds_steps=st.booleans(),
    observes=st.booleans(),
)


@st.composite
def outcomes(draw: st.DrawFn) -> Outcome:
    succeeded = draw(st.booleans())
    started = draw(st.none() | times)
    return Outcome(
        succeeded,
        result=draw(results) if succeeded else None,
        error=None if succeeded else draw(st.none() | any_text),
        retriable=draw(st.booleans()),
        kind=draw(kinds),
        traceback=draw(st.none() | any_text),
        started=started,
        ended=draw(st.none() | times),
        cancels_job=draw(st.booleans()),
        progress=draw(st.none() | st.just({"done": 3, "total": 7})),
    )


@st.composite
def attempts(draw: st.DrawFn) -> Attempt:
    plan = draw(plans)
    w = draw(st.integers(0, len(plan) - 1))
    t = draw(st.integers(0, len(plan[w]) - 1))
    policy = plan[w][t]
    r = draw(st.integers(0, policy.round_times - 1))
    a = draw(st.integers(0, policy.attempts_per_round - 1))
    name = draw(st.text("abcdefghij_", min_size=1, max_size=10))
    return Attempt(Position(w, t, r, a), name, plan, draw(st.booleans()), draw(times))


@st.composite
def rows(draw: st.DrawFn, attempt: Attempt, status: Status = Status.IN_PROGRESS) -> JobRecord:
    """A claimed row: earlier attempts of this task and others, a due hook of an
    earlier task perhaps, its end counted or not."""
    key = attempt.position.key()
    state = JobState(cursor=attempt.position)
    for other in draw(st.lists(st.sampled_from([key, "9.9", "8.0"]), max_size=14)):
        entry = {"started": "2020-01-01T00:00:00+00:00", "outcome": history.FAILED}
        history.append(state, other, dict(entry))
        state.attempts[other] = state.attempts.get(other, 0) + 1
        state.errors[other] = "E: before"
    if draw(st.booleans()):
        state.results["8.0"] = "earlier"
    if draw(st.booleans()):
        state.hold_hook("9.9", HOOK_PENDING, "another", attempt.claimed, None)
    state.counted = draw(st.booleans())
    return JobRecord(
        id="job-1",
        status=status,
        version=draw(st.integers(1, 50)),
        state=state.to_dict(),
        updated=attempt.claimed,
        lease_owner="worker",
    )


def verdict_for(attempt: Attempt, outcome: Outcome, now: datetime) -> Verdict:
    return decide(attempt, outcome, now, rand=lambda: NO_JITTER)


def entries_seen(state: JobState, key: str) -> int:
    """Attempts the history accounts for: kept entries and dropped ones."""
    return len(state.history.get(key, [])) + state.history_dropped.get(key, 0)


# -- the row of a recorded outcome ------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(attempt=attempts(), outcome=outcomes(), writer=writers, now=times, data=st.data())
def test_property_the_row_records_one_attempt_and_what_the_rules_decided(
    attempt: Attempt, outcome: Outcome, writer: Writer, now: datetime, data: st.DataObject
) -> None:
    row = data.draw(rows(attempt), label="row")
    verdict = verdict_for(attempt, outcome, now)
    keeps = verdict.asks_caller(writer) and data.draw(st.booleans(), label="keeps_next")
    write = outcome_write(row, attempt, verdict, writer, now, keeps_next=keeps)
    key = attempt.position.key()
    before, after = JobState.from_dict(row.state), JobState.from_dict(write.row.state)
    step = verdict.step

    # The rules' decision, on the outcome as recorded.
    assert step == rules.next_step(
        attempt.plan,
        attempt.position,
        verdict.outcome.succeeded,
        retriable=verdict.outcome.retriable,
        cancelled=verdict.outcome.cancels_job,
        rand=lambda: NO_JITTER,
    )
    assert (
        write.row.status
        is {
            Action.RUN: Status.IN_PROGRESS,
            Action.COMPLETE: Status.COMPLETED,
            Action.FAIL: Status.FAILED,
            Action.CANCEL: Status.CANCELLED,
        }[step.action]
    )
    assert write.row.version == row.version  # the compare-and-set's version
    assert write.row.updated == now

    # Attempts only grow: this task's by one, the others' not at all.
    assert write.attempts == after.attempts[key] == before.attempts.get(key, 0) + 1
    for other, count in before.attempts.items():
        assert after.attempts[other] >= count
        if other != key:
            assert after.attempts[other] == count

    # The attempt's history entry is appended once, last, and says who ran it.
    assert entries_seen(after, key) == entries_seen(before, key) + 1
    last = after.history[key][-1]
    assert last["worker"] == writer.owner
    assert last["started"] == (outcome.started or attempt.claimed).isoformat()
    assert last["ended"] == (verdict.outcome.ended or now).isoformat()
    assert last["outcome"] == verdict.outcome.history_kind
    for other in before.history:
        if other != key:
            assert after.history[other] == before.history[other]

    # Its result or its error, never both.
    if verdict.outcome.succeeded:
        assert after.results[key] == outcome.result and key not in after.errors
    else:
        assert after.errors[key] == verdict.outcome.error
    assert (key in after.skipped) is step.skipped_optional

    # What is written is storable: the state as JSON, the errors, the job's error.
    check_storable("state", write.row.state)
    json.dumps(write.row.state, allow_nan=False)
    for error in [write.row.error, *after.errors.values()]:
        assert error is None or unstorable_in(error) is None

    # A cancel's or a failure's end is marked counted iff this writer observes (or it
    # was); a Completed end is never swept, so never marked.
    if step.action in (Action.CANCEL, Action.FAIL):
        assert after.counted is (before.counted or writer.observes)
    else:
        assert after.counted is before.counted


@settings(max_examples=300, deadline=None)
@given(attempt=attempts(), outcome=outcomes(), writer=writers, now=times, data=st.data())
def test_property_the_effects_match_the_written_row(
    attempt: Attempt, outcome: Outcome, writer: Writer, now: datetime, data: st.DataObject
) -> None:
    row = data.draw(rows(attempt), label="row")
    verdict = verdict_for(attempt, outcome, now)
    keeps = verdict.asks_caller(writer) and data.draw(st.booleans(), label="keeps_next")
    write = outcome_write(row, attempt, verdict, writer, now, keeps_next=keeps)
    step, effects, key = write.step, write.after, attempt.position.key()
    runs = step.action is Action.RUN

    # Observers: told of an end or a retry only by a writer that observes.
    assert effects.tells_end is (writer.observes and not runs)
    assert not effects.tells_retry or (writer.observes and runs and not outcome.succeeded)
    assert not (effects.tells_end and effects.tells_retry)
    # One notice per end: the task's cancel, or the end that wakes Job.wait().
    assert (
        effects.notice
        is {
            Action.RUN: None,
            Action.COMPLETE: Notice.ENDED,
            Action.FAIL: Notice.ENDED,
            Action.CANCEL: Notice.CANCELLED_BY_TASK,
        }[step.action]
    )

    # The hook falls due on a final failure of a task that has one, held by this writer.
    final = not verdict.outcome.succeeded and (step.action is Action.FAIL or step.skipped_optional)
    assert effects.runs_hook is verdict.hook_due is (attempt.has_hook and final)
    hooks = JobState.from_dict(write.row.state).hooks
    if verdict.hook_due:
        assert hooks[key]["owner"] == writer.owner and hooks[key]["status"] == HOOK_PENDING
        assert (hooks[key]["until"] is None) is writer.holds_steps
    else:
        assert key not in hooks

    # The next step: held by this writer (for good in process; with a lease while
    # its hook runs or when the caller runs it here), else free until dispatched.
    assert effects.hands_on is (verdict.hook_due and runs and not writer.holds_steps)
    held = runs and (writer.holds_steps or verdict.hook_due or keeps)
    assert (write.row.lease_owner == writer.owner) is held
    if not held:
        assert write.row.lease_owner is None
    if not runs or writer.holds_steps:
        assert write.row.lease_expires is None
    elif held:
        assert write.row.lease_expires == now + timedelta(seconds=writer.lease_seconds)
    else:
        assert write.row.lease_expires == now + timedelta(
            seconds=step.delay + writer.dispatch_seconds
        )
    if runs:
        assert JobState.from_dict(write.row.state).cursor == step.position
        assert next_step_lease(writer, now, step, held=held) == (
            write.row.lease_owner,
            write.row.lease_expires,
        )


@settings(max_examples=200, deadline=None)
@given(
    attempt=attempts(),
    outcome=outcomes(),
    writer=writers,
    now=times,
    status=st.sampled_from(ENDED),
    data=st.data(),
)
def test_property_an_ended_row_never_comes_back_to_in_progress(
    attempt: Attempt,
    outcome: Outcome,
    writer: Writer,
    now: datetime,
    status: Status,
    data: st.DataObject,
) -> None:
    row = data.draw(rows(attempt, status), label="row")
    verdict = verdict_for(attempt, outcome, now)
    try:
        write = outcome_write(row, attempt, verdict, writer, now)
    except InvalidTransitionError:
        return  # the state machine refuses to end it again
    assert write.row.status is status
    kept = interrupted_write(row, attempt, outcome, writer, now)
    assert kept is None or kept.row.status is Status.CANCELLED is status


@settings(max_examples=200, deadline=None)
@given(attempt=attempts(), outcome=outcomes(), now=times)
def test_property_a_result_no_row_can_store_is_recorded_as_a_final_failure(
    attempt: Attempt, outcome: Outcome, now: datetime
) -> None:
    verdict = verdict_for(attempt, outcome, now)
    if not outcome.succeeded:
        assert verdict.outcome == outcome
        return
    try:
        check_storable(attempt.task_name, outcome.result)
    except TypeError:
        assert not verdict.outcome.succeeded and not verdict.outcome.retriable
        assert verdict.outcome.error is not None and attempt.task_name in verdict.outcome.error
        assert verdict.outcome.progress == outcome.progress  # what the task reported stays
        assert verdict.outcome.started == outcome.started and verdict.outcome.ended == now
    else:
        assert verdict.outcome == outcome


def test_decide_is_deterministic_given_the_jitter() -> None:
    plan = [[RetryPolicy(retry_count=3, retry_delay=2.0)]]
    attempt = Attempt(Position(), "t", plan, False, datetime(2026, 1, 1, tzinfo=timezone.utc))
    now = datetime(2026, 1, 2, tzinfo=timezone.utc)
    failed = Outcome(False, error="E: x")
    first = decide(attempt, failed, now, rand=lambda: 0.25)
    assert first == decide(attempt, failed, now, rand=lambda: 0.25)
    assert first.step.action is Action.RUN and first.step.position == Position(0, 0, 0, 1)


# -- a write decided again on a fresher row ---------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(attempt=attempts(), outcome=outcomes(), writer=writers, now=times, data=st.data())
def test_property_a_write_decided_again_after_a_hook_moved_keeps_both_sides(
    attempt: Attempt, outcome: Outcome, writer: Writer, now: datetime, data: st.DataObject
) -> None:
    seen = data.draw(rows(attempt), label="row")
    # Another writer (the recovery sweep) ran the earlier task's hook meanwhile.
    theirs = JobState.from_dict(seen.state)
    theirs.hook_done("9.9", "sweeper", now, None)
    theirs.hold_hook("7.7", HOOK_PENDING, "sweeper", now, now)
    current = seen.evolve(version=seen.version + 1, state=theirs.to_dict(), updated=now)
    assert only_hooks_moved(seen, current)

    verdict = verdict_for(attempt, outcome, now)
    mine = outcome_write(seen, attempt, verdict, writer, now)
    again = outcome_write(current, attempt, verdict, writer, now)
    assert again.row.version == current.version
    assert again.after == mine.after and again.step == mine.step
    rest = {HOOKS_KEY, "hooks_done"}
    assert {k: v for k, v in again.row.state.items() if k not in rest} == {
        k: v for k, v in mine.row.state.items() if k not in rest
    }
    assert again.row.evolve(state={}, version=0) == mine.row.evolve(state={}, version=0)
    merged = JobState.from_dict(again.row.state)
    assert "7.7" in merged.hooks and "9.9" in merged.hooks_done and "9.9" not in merged.hooks
    assert (attempt.position.key() in merged.hooks) is verdict.hook_due


@pytest.mark.parametrize(
    "change",
    [
        {"status": Status.CANCELLED},
        {"lease_owner": "someone-else"},
        {"error": "E: moved"},
        {"state": {"cursor": [0, 1, 0, 0]}},
        {"state": {COUNTED_KEY: True}},
    ],
)
def test_anything_but_the_hooks_moving_is_not_written_over(change: dict[str, Any]) -> None:
    seen = JobRecord(
        id="job-1", status=Status.IN_PROGRESS, lease_owner="w", state={"cursor": [0, 0, 0, 0]}
    )
    assert not only_hooks_moved(seen, seen.evolve(version=seen.version + 1, **change))


# -- the attempt that lost to a cancel --------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(attempt=attempts(), outcome=outcomes(), writer=writers, now=times, data=st.data())
def test_property_an_interrupted_attempt_is_kept_once_and_its_end_counted_once(
    attempt: Attempt, outcome: Outcome, writer: Writer, now: datetime, data: st.DataObject
) -> None:
    row = data.draw(rows(attempt, Status.CANCELLED), label="row")
    key = attempt.position.key()
    before = JobState.from_dict(row.state)
    kept = interrupted_write(row, attempt, outcome, writer, now)
    assert kept is not None
    after = JobState.from_dict(kept.row.state)
    assert kept.row.status is Status.CANCELLED and kept.row.version == row.version
    assert entries_seen(after, key) == entries_seen(before, key) + 1
    assert after.history[key][-1]["outcome"] == history.CANCELLED
    assert after.attempts[key] == before.attempts.get(key, 0) + 1
    assert kept.tells_end is (writer.observes and not before.counted)
    assert after.counted is (before.counted or writer.observes)
    check_storable("state", kept.row.state)
    # The same outcome again (written twice, or the row read again): nothing more.
    assert interrupted_write(kept.row, attempt, outcome, writer, now) is None


@given(
    attempt=attempts(),
    outcome=outcomes(),
    writer=writers,
    now=times,
    status=st.sampled_from([s for s in Status if s is not Status.CANCELLED]),
)
def test_property_only_a_cancelled_row_keeps_an_interrupted_attempt(
    attempt: Attempt, outcome: Outcome, writer: Writer, now: datetime, status: Status
) -> None:
    row = JobRecord(id="job-1", status=status, state={})
    assert interrupted_write(row, attempt, outcome, writer, now) is None
