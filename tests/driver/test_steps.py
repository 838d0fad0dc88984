"""StepIO: claiming and recording job steps, on the memory store and on PostgreSQL."""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest

from pypepper_dramatiq import IJobStore, JobRecord, RetryPolicy, Status
from pypepper_dramatiq.channels.messages import StepMessage
from pypepper_dramatiq.engine.step_io import (
    Claim,
    Outcome,
    Policies,
    StepIO,
    StepSkipped,
    plan_of,
    policy_of,
)
from pypepper_dramatiq.rules import steps as rules
from pypepper_dramatiq.rules.steps import Action, Position
from pypepper_dramatiq.stores.base import utcnow
from pypepper_dramatiq.stores.memory import MemoryJobStore

LEASE = 30.0
#: Slack for comparing a stored lease with the clock read around the call.
SLACK = timedelta(seconds=1)


@pytest.fixture(params=["memory", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request: pytest.FixtureRequest) -> IJobStore:
    if request.param == "memory":
        return MemoryJobStore()
    pg: IJobStore = request.getfixturevalue("pg_store")
    return pg


def task(name: str, **policy: Any) -> dict[str, Any]:
    """A stored task as ``Task.to_dict`` writes it (only the fields StepIO reads matter)."""
    return {"name": name, "executor_id": "steps.unused", "params": {}, **policy}


def new_record(*workflows: list[dict[str, Any]], **fields: Any) -> JobRecord:
    return JobRecord(
        id=uuid.uuid4().hex,
        channel_id="steps",
        status=Status.SCHEDULED,
        payload={"workflows": [{"tasks": tasks} for tasks in workflows]},
        **fields,
    )


def stored(store: IJobStore, record: JobRecord) -> JobRecord:
    """Insert ``record`` and return the row as the store holds it."""
    assert store.put(record)
    row = store.get(record.id)
    assert row is not None
    return row


def book_on(store: IJobStore, owner: str = "worker-a", lease: float = LEASE) -> StepIO:
    return StepIO(lambda: store, owner, lease)


def message(record: JobRecord, *position: int, with_record: bool = False) -> StepMessage:
    return StepMessage(record.id, Position(*position), record if with_record else None)


def row_of(store: IJobStore, job_id: str) -> JobRecord:
    row = store.get(job_id)
    assert row is not None
    return row


def in_progress(store: IJobStore, *workflows: list[dict[str, Any]]) -> tuple[JobRecord, Claim]:
    """A job claimed by worker-a at its first task."""
    record = stored(store, new_record(*workflows))
    return record, book_on(store).claim(message(record))


# -- claim ----------------------------------------------------------------------------------


def test_claim_of_a_scheduled_job_starts_it(store: IJobStore) -> None:
    record = stored(store, new_record([task("a"), task("b")]))
    before = utcnow()

    claim = book_on(store).claim(message(record))

    after = utcnow()
    row = row_of(store, record.id)
    assert row.status is Status.IN_PROGRESS
    assert row.state["cursor"] == [0, 0, 0, 0]
    assert row.lease_owner == "worker-a"
    assert row.lease_expires is not None
    assert before + timedelta(seconds=LEASE) - SLACK <= row.lease_expires
    assert row.lease_expires <= after + timedelta(seconds=LEASE) + SLACK
    assert row.version == record.version + 1
    assert claim.position == Position()
    assert claim.record.version == row.version
    assert claim.task["name"] == "a"


def test_claim_starts_at_the_first_task_after_empty_workflows(store: IJobStore) -> None:
    record = stored(store, new_record([], [task("only")]))

    claim = book_on(store).claim(message(record))

    assert claim.position == Position(1, 0)
    assert row_of(store, record.id).state["cursor"] == [1, 0, 0, 0]


def test_claim_of_a_job_without_tasks_completes_it_unrun(store: IJobStore) -> None:
    record = stored(store, new_record([], []))

    with pytest.raises(StepSkipped) as info:
        book_on(store).claim(message(record))

    assert not info.value.dead
    assert row_of(store, record.id).status is Status.COMPLETED


@pytest.mark.parametrize("position", [(0, 1), (0, 0, 0, 1), (0, 0, 1, 0)])
def test_a_scheduled_job_is_only_started_by_its_first_message(
    store: IJobStore, position: tuple[int, ...]
) -> None:
    record = stored(store, new_record([task("a"), task("b", retry_count=3, round_times=2)]))

    with pytest.raises(StepSkipped) as info:
        book_on(store).claim(message(record, *position))

    assert not info.value.dead
    assert row_of(store, record.id) == record


@pytest.mark.parametrize("position", [(0, 0), (0, 1, 0, 1), (0, 2)])
def test_stale_message_is_skipped(store: IJobStore, position: tuple[int, ...]) -> None:
    record, claim = in_progress(store, [task("a"), task("b", retry_count=1), task("c")])
    book_on(store).record(claim, Outcome(True, "a-done"))  # cursor moves to 0.1
    row = row_of(store, record.id)
    assert row.state["cursor"] == [0, 1, 0, 0]

    with pytest.raises(StepSkipped) as info:
        book_on(store, "worker-b").claim(message(record, *position))

    assert not info.value.dead
    assert row_of(store, record.id) == row


def test_second_claim_while_the_lease_is_held_is_skipped(store: IJobStore) -> None:
    record, _ = in_progress(store, [task("a")])
    row = row_of(store, record.id)

    with pytest.raises(StepSkipped):
        book_on(store, "worker-b").claim(message(record))

    assert row_of(store, record.id) == row


def test_claim_after_the_lease_lapsed_takes_the_step_over(store: IJobStore) -> None:
    record, _ = in_progress(store, [task("a")])
    row = row_of(store, record.id)
    lapsed = row.evolve(lease_expires=utcnow() - timedelta(seconds=1))
    assert store.put(lapsed)

    claim = book_on(store, "worker-b").claim(message(record))

    row = row_of(store, record.id)
    assert claim.position == Position()
    assert row.status is Status.IN_PROGRESS
    assert row.lease_owner == "worker-b"
    assert row.lease_expires is not None and row.lease_expires > utcnow()


@pytest.mark.parametrize("status", [Status.COMPLETED, Status.FAILED, Status.CANCELLED])
def test_claim_of_an_ended_job_is_skipped(store: IJobStore, status: Status) -> None:
    record, _ = in_progress(store, [task("a")])
    assert store.put(row_of(store, record.id).evolve(status=status, lease_owner=None))
    row = row_of(store, record.id)

    with pytest.raises(StepSkipped) as info:
        book_on(store, "worker-b").claim(message(record))

    assert not info.value.dead
    assert row_of(store, record.id) == row


def test_claim_of_a_cancelled_scheduled_job_is_skipped(store: IJobStore) -> None:
    record = stored(store, new_record([task("a")]))
    assert store.put(record.evolve(status=Status.CANCELLED))

    with pytest.raises(StepSkipped):
        book_on(store).claim(message(record))

    assert row_of(store, record.id).status is Status.CANCELLED


def test_missing_row_is_healed_from_the_message_record(store: IJobStore) -> None:
    record = new_record([task("a")])
    assert store.get(record.id) is None

    claim = book_on(store).claim(message(record, with_record=True))

    row = row_of(store, record.id)
    assert claim.position == Position()
    assert row.status is Status.IN_PROGRESS
    assert row.payload == record.payload
    assert row.lease_owner == "worker-a"


def test_message_without_record_for_an_unknown_job_is_dead(store: IJobStore) -> None:
    with pytest.raises(StepSkipped) as info:
        book_on(store).claim(StepMessage(uuid.uuid4().hex, Position()))

    assert info.value.dead


def test_job_stored_without_workflows_is_dead(store: IJobStore) -> None:
    record = stored(store, new_record().evolve(payload=None))

    with pytest.raises(StepSkipped) as info:
        book_on(store).claim(message(record))

    assert info.value.dead


# -- record ---------------------------------------------------------------------------------


def test_success_advances_the_cursor_and_stores_the_result(store: IJobStore) -> None:
    record, claim = in_progress(store, [task("a"), task("b")])
    before = utcnow()

    decision = book_on(store).record(claim, Outcome(True, {"rows": 3}))

    assert decision is not None and decision.action is Action.RUN
    assert decision.position == Position(0, 1)
    assert decision.delay == 0
    row = row_of(store, record.id)
    assert row.status is Status.IN_PROGRESS
    assert row.state["cursor"] == [0, 1, 0, 0]
    assert row.state["results"] == {"0.0": {"rows": 3}}
    assert row.state["attempts"] == {"0.0": 1}
    assert row.lease_owner is None  # dispatched, not held
    assert row.lease_expires is not None
    assert row.lease_expires >= before + timedelta(seconds=LEASE) - SLACK


def test_next_step_can_be_claimed_after_record(store: IJobStore) -> None:
    record, claim = in_progress(store, [task("a"), task("b")])
    book_on(store).record(claim, Outcome(True, "a"))

    claim = book_on(store, "worker-b").claim(message(record, 0, 1))

    assert claim.position == Position(0, 1)
    assert claim.results_by_name() == {"a": "a"}
    assert row_of(store, record.id).lease_owner == "worker-b"


def test_failure_with_a_delayed_retry_reserves_the_step_past_the_delay(store: IJobStore) -> None:
    delay = 120.0
    record, claim = in_progress(store, [task("a", retry_count=2, retry_delay=delay)])
    before = utcnow()

    decision = book_on(store, lease=5).record(claim, Outcome(False, error="RuntimeError: boom"))

    assert decision is not None and decision.action is Action.RUN
    assert decision.position == Position(0, 0, 0, 1)
    assert decision.delay == delay
    row = row_of(store, record.id)
    assert row.status is Status.IN_PROGRESS
    assert row.state["cursor"] == [0, 0, 0, 1]
    assert row.state["errors"] == {"0.0": "RuntimeError: boom"}
    assert row.state["attempts"] == {"0.0": 1}
    assert row.lease_expires is not None
    assert row.lease_expires >= before + timedelta(seconds=delay)


def test_failure_at_the_end_of_a_round_starts_the_next_round(store: IJobStore) -> None:
    record, claim = in_progress(store, [task("a", round_times=2, retry_delay=60)])

    decision = book_on(store).record(claim, Outcome(False, error="E: 1"))

    assert decision is not None and decision.position == Position(0, 0, 1, 0)
    assert decision.delay == 0  # no delay between rounds
    assert row_of(store, record.id).state["cursor"] == [0, 0, 1, 0]


def test_attempts_accumulate_across_retries(store: IJobStore) -> None:
    record, claim = in_progress(store, [task("a", retry_count=2)])
    book_on(store).record(claim, Outcome(False, error="E: 1"))
    claim = book_on(store).claim(message(record, 0, 0, 0, 1))

    book_on(store).record(claim, Outcome(True, "third time lucky"))

    row = row_of(store, record.id)
    assert row.status is Status.COMPLETED
    assert row.state["attempts"] == {"0.0": 2}
    assert row.state["results"] == {"0.0": "third time lucky"}
    assert row.state["errors"] == {}


def test_last_success_completes_the_job(store: IJobStore) -> None:
    record, claim = in_progress(store, [task("a")])

    decision = book_on(store).record(claim, Outcome(True, 7))

    assert decision is not None and decision.action is Action.COMPLETE
    row = row_of(store, record.id)
    assert row.status is Status.COMPLETED
    assert row.state["results"] == {"0.0": 7}
    assert row.lease_owner is None


def test_required_task_out_of_attempts_fails_the_job(store: IJobStore) -> None:
    record, claim = in_progress(store, [task("a"), task("b")])

    decision = book_on(store).record(claim, Outcome(False, error="RuntimeError: boom"))

    assert decision is not None and decision.action is Action.FAIL
    row = row_of(store, record.id)
    assert row.status is Status.FAILED
    assert row.error == "task a failed: RuntimeError: boom"
    assert row.state["errors"] == {"0.0": "RuntimeError: boom"}


def test_a_completing_job_logs_nothing_above_debug(
    store: IJobStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="pypepper_dramatiq.engine.step_io")
    _, claim = in_progress(store, [task("a")])
    book_on(store).record(claim, Outcome(True, 7))

    ours = [r for r in caplog.records if r.name == "pypepper_dramatiq.engine.step_io"]
    assert {r.levelno for r in ours} == {logging.DEBUG}
    assert [r.action for r in ours] == ["start", "complete"]  # type: ignore[attr-defined]


def test_a_failing_job_logs_one_warning_with_its_error(
    store: IJobStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="pypepper_dramatiq.engine.step_io")
    record, claim = in_progress(store, [task("a")])
    book_on(store).record(claim, Outcome(False, error="RuntimeError: boom"))

    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert record.id in warnings[0].getMessage()
    assert "task a failed for good after 1 attempt: RuntimeError: boom" in warnings[0].getMessage()


def test_optional_task_out_of_attempts_is_skipped(store: IJobStore) -> None:
    record, claim = in_progress(store, [task("a", optional=True), task("b")])

    decision = book_on(store).record(claim, Outcome(False, error="E: x"))

    assert decision is not None and decision.action is Action.RUN
    assert decision.skipped_optional
    row = row_of(store, record.id)
    assert row.state["skipped"] == ["0.0"]
    assert row.state["cursor"] == [0, 1, 0, 0]


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ({1, 2}, "a set"),
        (float("nan"), "a float"),
        ({"text": "a\x00b"}, "a dict"),
        (object(), "a object"),
    ],
    ids=["set", "nan", "nul-in-text", "object"],
)
def test_a_result_the_row_cannot_store_fails_the_attempt_naming_task_and_type(
    store: IJobStore, value: Any, kind: str
) -> None:
    # Never stored as something else (its repr): the caller would read a value
    # the task never returned. Not retried: the same code returns the same type.
    record, claim = in_progress(store, [task("a", retry_count=3), task("b")])

    decision = book_on(store).record(claim, Outcome(True, value))

    assert decision is not None and decision.action is Action.FAIL
    row = row_of(store, record.id)
    assert row.status is Status.FAILED
    assert row.state["results"] == {}
    assert row.error is not None
    assert "ResultNotStorableError" in row.error and "'a'" in row.error and kind in row.error
    assert row.state["attempts"] == {"0.0": 1}


def test_json_values_are_stored_as_they_are(store: IJobStore) -> None:
    record, claim = in_progress(store, [task("a")])
    value = {"rows": [1, 2.5, None, True, "é"], "nested": {"k": []}}

    book_on(store).record(claim, Outcome(True, value))

    assert row_of(store, record.id).state["results"] == {"0.0": value}


def test_record_after_a_cancel_returns_none_and_keeps_cancelled(store: IJobStore) -> None:
    record, claim = in_progress(store, [task("a"), task("b")])
    assert store.put(row_of(store, record.id).evolve(status=Status.CANCELLED))
    cancelled = row_of(store, record.id)

    assert book_on(store).record(claim, Outcome(True, "late")) is None

    after = row_of(store, record.id)
    assert after.status is Status.CANCELLED and not after.state.get("results")
    # The late attempt is kept in the history only, as cancelled; nothing else moved.
    [attempt] = after.state["history"]["0.0"]
    assert attempt["outcome"] == "cancelled"
    assert after.updated == cancelled.updated and after.error == cancelled.error


# -- races ----------------------------------------------------------------------------------


def race(store: IJobStore, record: JobRecord, position: tuple[int, ...]) -> dict[str, object]:
    """Two workers claim the same step at the same moment; what each got, by owner."""
    barrier = threading.Barrier(2)
    outcomes: dict[str, object] = {}

    def claim_as(owner: str) -> None:
        book = book_on(store, owner)
        barrier.wait(timeout=10)
        try:
            outcomes[owner] = book.claim(message(record, *position))
        except StepSkipped as exc:
            outcomes[owner] = exc

    threads = [threading.Thread(target=claim_as, args=(o,)) for o in ("w1", "w2")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return outcomes


@pytest.mark.parametrize("started", [False, True], ids=["scheduled", "in-progress"])
def test_two_threads_claiming_one_step_one_wins(store: IJobStore, started: bool) -> None:
    for _ in range(5):
        record = stored(store, new_record([task("a"), task("b")]))
        position: tuple[int, ...] = (0, 0)
        if started:
            book_on(store).record(book_on(store).claim(message(record)), Outcome(True, "a"))
            position = (0, 1)

        outcomes = race(store, record, position)

        won = [o for o, value in outcomes.items() if isinstance(value, Claim)]
        lost = [o for o, value in outcomes.items() if isinstance(value, StepSkipped)]
        assert len(won) == 1 and len(lost) == 1, outcomes
        assert row_of(store, record.id).lease_owner == won[0]


# -- the producer's Scheduled write racing a worker's heal ------------------------------------


def test_a_producer_write_between_heal_and_claim_does_not_strand_the_job() -> None:
    from pypepper_dramatiq.channels.messages import StepMessage
    from pypepper_dramatiq.engine.step_io import StepIO
    from pypepper_dramatiq.rules.status import Status
    from pypepper_dramatiq.rules.steps import Position
    from pypepper_dramatiq.stores.base import JobRecord
    from pypepper_dramatiq.stores.memory import MemoryJobStore

    class ProducerRacesTheClaim(MemoryJobStore):
        """Before the worker's first InProgress write, the producer rewrites Scheduled."""

        raced = False

        def advance(self, record: JobRecord) -> bool:
            if record.status is Status.IN_PROGRESS and not self.raced:
                self.raced = True
                current = self.get(record.id)
                assert current is not None and self.put(current)
            return super().advance(record)

    store = ProducerRacesTheClaim()
    first = JobRecord(
        id="raced",
        channel_id="c",
        status=Status.SCHEDULED,
        payload={"workflows": [{"tasks": [{"name": "t", "executor_id": "x"}]}]},
    )
    book = StepIO(lambda: store, "worker-1", lease_seconds=30)
    claim = book.claim(StepMessage("raced", Position(), first))
    assert store.raced
    stored = store.get("raced")
    assert stored is not None and stored.status is Status.IN_PROGRESS
    assert stored.lease_owner == "worker-1" and claim.record.version == stored.version


# -- the plan of a stored job ---------------------------------------------------------------


def test_policies_build_each_table_once_and_only_when_read(monkeypatch: pytest.MonkeyPatch) -> None:
    import pypepper_dramatiq.engine.step_io as steps_module

    stored_tasks = [task(f"t{i}", retry_count=i) for i in range(50)]
    built: list[str] = []
    real = steps_module.policy_of

    def counting(stored: dict[str, Any]) -> RetryPolicy:
        built.append(stored["name"])
        return real(stored)

    monkeypatch.setattr(steps_module, "policy_of", counting)
    policies = Policies(stored_tasks)
    assert len(policies) == 50 and built == []
    assert policies[7].retry_count == 7 and policies[7] is policies[7]
    assert policies[-1].retry_count == 49
    assert built == ["t7", "t49"]
    assert [p.retry_count for p in policies[1:3]] == [1, 2]
    for outside in (50, -51):
        with pytest.raises(IndexError):
            policies[outside]


def test_a_lazy_plan_decides_like_an_eager_one() -> None:
    stored = [
        [task("a", retry_count=1), task("b", optional=True, round_times=2)],
        [],
        [task("c", retry_until_completed=True, retry_until_max=3)],
    ]
    eager = [[policy_of(t) for t in workflow] for workflow in stored]
    lazy = plan_of(stored)
    assert rules.first_step(lazy) == rules.first_step(eager)
    for workflow, tasks in enumerate(stored):
        for index in range(len(tasks)):
            for attempt in range(3):
                for succeeded in (True, False):
                    at = Position(workflow, index, 0, attempt)
                    assert rules.next_step(lazy, at, succeeded) == rules.next_step(
                        eager, at, succeeded
                    )
