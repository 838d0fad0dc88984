"""Group commit's store statements: ``claim_steps`` and ``advance_each``, on every store.

A batch decides each of its rows exactly as the one-row statement would (a won
claim, a stale message, a cancelled job, a missing row, a stale version, a
refusal by the unique key index), and answers them in the order asked.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from pypepper_dramatiq.errors import DuplicateJobError
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import IJobStore, JobRecord, StepClaim

from .test_store_contract import T0, job, store, stored

__all__ = ["store"]

NOW = T0 + timedelta(hours=1)
UNTIL = NOW + timedelta(seconds=30)
AT = [0, 1, 0, 0]


def running(store: IJobStore, job_id: str, **fields: Any) -> JobRecord:
    fields.setdefault("state", {"cursor": AT, "results": {"0.0": 1}})
    assert store.put(job(job_id, status=Status.IN_PROGRESS, payload={"workflows": []}, **fields))
    return stored(store, job_id)


def ask(job_id: str, cursor: list[int] = AT, owner: str = "me", start: bool = False) -> StepClaim:
    return StepClaim(job_id, cursor, owner, NOW, UNTIL, start)


class TestClaimSteps:
    def test_mixed_outcomes_in_one_batch(self, store: IJobStore) -> None:
        won = running(store, "won")
        stale = running(store, "stale")
        held = running(store, "held", lease_owner="other", lease_expires=UNTIL)
        assert store.put(job("cancelled", status=Status.CANCELLED))
        assert store.put(
            job("fresh", status=Status.SCHEDULED, payload={"workflows": [{"tasks": []}]})
        )
        answers = store.claim_steps(
            [
                ask("stale", [0, 0, 0, 0]),  # a message for a step already done
                ask("won"),
                ask("cancelled", [0, 0, 0, 0], start=True),
                ask("missing", [0, 0, 0, 0], start=True),  # no row yet: the caller heals it
                ask("held"),
                ask("fresh", [0, 0, 0, 0], start=True),
            ]
        )
        assert [a is not None for a in answers] == [False, True, False, False, False, True]
        claimed = answers[1]
        assert claimed == stored(store, "won")
        assert claimed is not None and claimed.version == won.version + 1
        assert claimed.lease_owner == "me" and claimed.lease_expires == UNTIL
        assert claimed.state == {"cursor": AT, "results": {"0.0": 1}}
        started = answers[5]
        assert started == stored(store, "fresh")
        assert started is not None and started.status is Status.IN_PROGRESS
        assert started.state["cursor"] == [0, 0, 0, 0] and started.payload == {
            "workflows": [{"tasks": []}]
        }
        assert stored(store, "stale") == stale and stored(store, "held") == held
        assert stored(store, "cancelled").status is Status.CANCELLED
        assert store.get("missing") is None

    def test_a_retry_after_the_start_deadline_is_refused_in_a_batch(self, store: IJobStore) -> None:
        retry = [0, 1, 0, 1]
        late = running(store, "late", state={"cursor": retry}, start_deadline=NOW - timedelta(1))
        running(store, "in-time", state={"cursor": retry}, start_deadline=NOW)
        running(store, "next-task", start_deadline=NOW - timedelta(1))  # at [0, 1, 0, 0]
        answers = store.claim_steps([ask("late", retry), ask("in-time", retry), ask("next-task")])
        assert [a is not None for a in answers] == [False, True, True]
        assert stored(store, "late") == late

    def test_one_job_asked_for_twice_is_won_once(self, store: IJobStore) -> None:
        running(store, "job-1")
        answers = store.claim_steps([ask("job-1", owner="a"), ask("job-1", owner="b")])
        assert sum(a is not None for a in answers) == 1
        winner = "a" if answers[0] is not None else "b"
        assert stored(store).lease_owner == winner

    def test_no_request_no_answer(self, store: IJobStore) -> None:
        assert store.claim_steps([]) == []

    def test_each_answer_is_the_row_as_stored_in_every_column(self, store: IJobStore) -> None:
        # A store may answer a batch with only what the claim did not write from its
        # request (PostgreSQL's does): each answer, rebuilt, must still be the row as
        # stored and as the one-row claim answers it, column by column.
        moment = NOW - timedelta(minutes=1, microseconds=654_321)
        columns: dict[str, Any] = {
            "category": "cat, é",
            "error": 'ValueError: "quotes", ünïcode',
            "not_before": moment,
            "release_at": moment + timedelta(microseconds=3),
            "start_deadline": NOW + timedelta(hours=1, microseconds=7),
        }
        payload = {"workflows": [{"tasks": [{"name": "t", "params": {"x": [1.5, "é"]}}]}]}
        for job_id in ("running", "running-alone"):
            running(store, job_id, waits={"parents": ["p"]}, unique_key=f"{job_id}, key", **columns)
        for job_id in ("first", "first-alone"):
            state = {"cursor": [0, 0, 0, 0], "big": 8.850783147909827e16}
            first = job(job_id, status=Status.SCHEDULED, state=state, payload=payload, **columns)
            assert store.put(first.evolve(unique_key=f"{job_id}, key"))
        now = NOW + timedelta(microseconds=123_457)
        lease = now + timedelta(seconds=30, microseconds=1)
        asked = [
            StepClaim("running", AT, "me", now, lease),
            StepClaim("first", [0, 0, 0, 0], "me", now, lease, True),
        ]
        answers = store.claim_steps(asked)
        alone = [
            store.claim_step(
                f"{r.job_id}-alone", r.cursor, r.owner, r.now, r.lease_until, start=r.start
            )
            for r in asked
        ]
        for request, answer, single in zip(asked, answers, alone, strict=True):
            assert isinstance(answer, JobRecord) and isinstance(single, JobRecord)
            assert answer == stored(store, request.job_id)
            twin = single.evolve(id=request.job_id, created=answer.created)
            assert answer == twin.evolve(unique_key=answer.unique_key)
            assert answer.unique_key == f"{request.job_id}, key"
            assert answer.status is Status.IN_PROGRESS and answer.updated == now


class TestAdvanceEach:
    def test_mixed_outcomes_in_one_batch(self, store: IJobStore) -> None:
        a, b = running(store, "a"), running(store, "b")
        assert store.put(job("done", status=Status.COMPLETED))
        done = stored(store, "done")
        later = T0 + timedelta(minutes=1)
        answers = store.advance_each(
            [
                a.evolve(state={"cursor": [0, 2, 0, 0]}, updated=later, lease_owner=None),
                b.evolve(version=b.version + 3, state={"mark": "stale"}),  # stale version
                job("nobody", status=Status.IN_PROGRESS),  # no row
                done.evolve(status=Status.IN_PROGRESS),  # a finished job never moves back
                stored(store, "b").evolve(status=Status.COMPLETED, payload=None),
            ]
        )
        assert answers == [True, False, False, False, True]
        assert stored(store, "a").state == {"cursor": [0, 2, 0, 0]}
        assert stored(store, "a").version == a.version + 1 and stored(store, "a").updated == later
        assert stored(store, "b").status is Status.COMPLETED
        assert stored(store, "b").payload == {"workflows": []}  # never part of an advance
        assert stored(store, "done") == done
        assert store.get("nobody") is None

    def test_a_key_refusal_is_answered_in_its_rows_place(self, store: IJobStore) -> None:
        assert store.put(job("holder", status=Status.SCHEDULED, unique_key="k"))
        other, third = running(store, "other"), running(store, "third")
        answers = store.advance_each(
            [
                third.evolve(state={"mark": 3}),
                other.evolve(unique_key="k"),  # a second active job with key k: refused
                stored(store, "holder").evolve(state={"mark": "h"}),
            ]
        )
        assert answers[0] is True and answers[2] is True
        refused = answers[1]
        assert isinstance(refused, DuplicateJobError) and refused.existing_id == "holder"
        assert stored(store, "other") == other
        assert stored(store, "third").state == {"mark": 3}
        assert stored(store, "holder").state == {"mark": "h"}

    def test_one_job_given_twice_is_written_once(self, store: IJobStore) -> None:
        row = running(store, "job-1")
        answers = store.advance_each([row.evolve(state={"by": "a"}), row.evolve(state={"by": "b"})])
        assert sorted(answers, key=str) == [False, True]
        assert stored(store).state == {"by": "a" if answers[0] is True else "b"}
        assert stored(store).version == row.version + 1

    def test_no_record_no_answer(self, store: IJobStore) -> None:
        assert store.advance_each([]) == []

    def test_every_column_is_written_as_advance_writes_it(self, store: IJobStore) -> None:
        # The batch sends its rows as one JSON array: times, JSON values (a float
        # past 1e16, nested arrays, non-ASCII text), NULLs and text must come back
        # exactly as the one-row statement leaves them.
        batch, alone = running(store, "batch"), running(store, "alone")
        moment = T0 + timedelta(minutes=3, microseconds=123_457)
        fields: dict[str, Any] = {
            "state": {"cursor": [0, 1, 0, 0], "big": 8.850783147909827e16, "t": ["é", [1.5]]},
            "updated": moment,
            "error": "TypeError: ünïcode, 'quotes' \"and\" commas,",
            "lease_owner": None,
            "lease_expires": moment + timedelta(seconds=1),
            "not_before": moment + timedelta(seconds=2),
            "release_at": None,
            "start_deadline": moment + timedelta(seconds=4),
            "unique_key": "key, with comma",
            "waits": {"parents": ["x"]},
            "waiting_since": moment,
            "status": Status.COMPLETED,
        }
        assert store.advance_each([batch.evolve(**fields), job("other-row")]) == [True, False]
        assert store.advance(alone.evolve(**fields))
        written, expected = stored(store, "batch"), stored(store, "alone")
        assert written == expected.evolve(id="batch", created=written.created)
        assert written.state["big"] == 8.850783147909827e16


@pytest.mark.parametrize("size", [1, 2, 30])
def test_batches_of_any_size_answer_in_order(store: IJobStore, size: int) -> None:
    rows = [running(store, f"job-{n:02d}") for n in range(size)]
    claims = store.claim_steps([ask(r.id, owner=f"w{n}") for n, r in enumerate(rows)][::-1])
    assert [c.lease_owner if c else None for c in claims] == [f"w{n}" for n in range(size)][::-1]
    assert [c.id if c else None for c in claims] == [r.id for r in rows][::-1]
