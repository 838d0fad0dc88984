"""Poison text and refused writes with a real ``dramatiq`` worker, Redis and PostgreSQL
(and MariaDB, which keeps a NUL but refuses a lone surrogate).

Found by probing with real workers: a NUL in a task's exception text (or in a
progress note) made PostgreSQL refuse the write recording the attempt; the step
was left to its lease and the task ran again after each lapse (2, 5, 9 runs
after 10/30/60 s, with retry_count=0) and the job never ended. Now the text is
stored escaped and the job runs its retry table to the end; a write the store
refuses for its content is a failed attempt; a refused heal dead-letters its
message instead of deferring it forever.
"""

from __future__ import annotations

import pytest
from refusals import HALVES, POISON, refusing

from pypepper_dramatiq import Job, Status, Workflow
from pypepper_dramatiq.channels.messages import StepMessage
from pypepper_dramatiq.rules.steps import Position

from .conftest import BOTH_STORES
from .harness import Cluster, wait_for
from .worker_app import CHANNEL, joined, poison_text

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

#: retry_count=2 in worker_app: three attempts.
ATTEMPTS = 3


@pytest.mark.parametrize("store_backend", BOTH_STORES, indirect=True)
@pytest.mark.parametrize("where", ["error", "note"])
def test_poison_text_ends_the_job_after_its_retries_with_the_text_escaped(
    cluster: Cluster, where: str
) -> None:
    cluster.start_worker()
    job = cluster.schedule(poison_text.task(name="poison", in_note=where == "note"))

    [record] = cluster.wait_status([job], timeout=60, statuses=[Status.FAILED]).values()

    assert cluster.runs(job, "poison") == ATTEMPTS
    assert record.state["attempts"]["0.0"] == ATTEMPTS
    assert len(record.state["history"]["0.0"]) == ATTEMPTS
    if where == "error":
        assert record.error == "task poison failed: RuntimeError: bad\\x00byte, lone \\udc80"
        assert record.state["history"]["0.0"][-1]["message"] == "bad\\x00byte, lone \\udc80"
    else:
        assert record.progress["0.0"]["note"] == "half\\x00way \\udc80"


@pytest.mark.parametrize("store_backend", BOTH_STORES, indirect=True)
def test_a_result_the_database_refuses_is_a_failed_attempt(cluster: Cluster) -> None:
    cluster.start_worker()
    with refusing(cluster.store_uri):
        job = cluster.schedule(joined.task(name="joined", first=HALVES[0], second=HALVES[1]))
        [record] = cluster.wait_status([job], timeout=60, statuses=[Status.FAILED]).values()

    assert cluster.runs(job, "joined") == ATTEMPTS
    entries = record.state["history"]["0.0"]
    assert [e["error_type"] for e in entries] == ["StoreDataError"] * ATTEMPTS
    assert record.error is not None
    assert "the job store refused this attempt's result" in record.error
    assert "://" not in record.error  # the database's words, not where it is


def test_a_refused_heal_dead_letters_the_message_instead_of_deferring_it(
    cluster: Cluster,
) -> None:
    # The first message of a job whose producer could not store its row: the
    # worker heals the row from the message, and the database refuses it.
    job = Job(category="it", channel_id=CHANNEL)
    job.workflows.append(Workflow([joined.task(name="t", first=POISON, second="")]))
    worker = cluster.start_worker()
    with refusing(cluster.store_uri):
        message = StepMessage(job.id, Position(), job.to_record()).to_message(CHANNEL)
        # Redis keys its messages by an id of its own, kept in the message's options.
        redis_id = cluster.broker.enqueue(message).options["redis_message_id"]
        dead = f"dramatiq:{CHANNEL}.XQ"
        wait_for(
            lambda: cluster.redis.zscore(dead, redis_id) is not None,
            30,
            f"the message in {dead}\n{cluster.logs()}",
        )
    assert f"dead-lettering message {message.message_id}" in worker.log()
    # Not deferred: no copy of it waits in the queue or its delay queue.
    assert not cluster.redis.hlen(f"dramatiq:{CHANNEL}.msgs")
    assert not cluster.redis.hlen(f"dramatiq:{CHANNEL}.DQ.msgs")
    assert cluster.runs(job, "t") == 0
    assert Job.get_saved(job.id) is None
