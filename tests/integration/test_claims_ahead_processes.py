"""Claims ahead (``claim_fetched``) with real ``dramatiq`` worker processes on Redis.

The consumer thread claims every step message of one fetch in one statement
before the worker threads take them. A step so claimed holds a lease while it
waits: these tests check that a worker SIGKILLed while holding such a batch has
each of its steps recovered by the lease and run once, and that a cancel reaching
a step claimed ahead stops it from starting.

The worker threads leave the outcomes to the process's completion thread, which
records them, then acknowledges their messages. A worker SIGKILLed with outcomes
queued there (not recorded) has each of those steps run again exactly once (the
at-least-once rule of an attempt whose outcome was never recorded); one SIGKILLed
between the record and the acknowledgement has each redelivered message dropped
unrun (its claim finds the step done). Plain actors beside the steps, under load,
each run exactly once.
"""

from __future__ import annotations

from pypepper_dramatiq import Job, Status

from .harness import Cluster, wait_for
from .worker_app import CHANNEL, ENV, flaky_plain, probe

#: Steps waiting behind the one the single worker thread runs.
WAITING = 5
#: One fetch holds them all: the blocker and the waiting steps.
AHEAD = {ENV["claim_fetched"]: "1", "dramatiq_queue_prefetch": str(WAITING + 1)}


def claimed_ahead(cluster: Cluster, jobs: list[Job], owner_of: Job) -> bool:
    """Whether every one of ``jobs`` is InProgress under the lease of the worker
    that runs ``owner_of`` (claimed ahead), none of their tasks started."""
    owner = cluster.saved(owner_of).lease_owner
    rows = [cluster.saved(job) for job in jobs]
    return owner is not None and all(
        row.status is Status.IN_PROGRESS and row.lease_owner == owner for row in rows
    )


def test_a_worker_sigkilled_holding_a_claimed_batch_has_each_step_recovered_once(
    cluster: Cluster,
) -> None:
    lease = 2.0
    blocker = cluster.schedule(probe.task(name="blocker", sleep=60))
    waiting = [cluster.schedule(probe.task(name="waiting")) for _ in range(WAITING)]
    crashed = cluster.start_worker(
        threads=1, lease_seconds=lease, heartbeat_timeout_ms=1000, extra_env=AHEAD
    )
    wait_for(lambda: cluster.stamp("running", blocker, "blocker"), 30, "the blocker to start")
    wait_for(lambda: claimed_ahead(cluster, waiting, blocker), 30, "the batch claimed ahead")
    assert all(cluster.runs(job, "waiting") == 0 for job in waiting)

    crashed.kill()
    cluster.start_worker(threads=2, lease_seconds=lease, heartbeat_timeout_ms=1000, extra_env=AHEAD)
    records = cluster.wait_status(waiting, timeout=60)

    assert all(record.status is Status.COMPLETED for record in records.values()), records
    assert [cluster.runs(job, "waiting") for job in waiting] == [1] * WAITING
    survivor = cluster.workers[1].group_pids()
    assert all(set(cluster.run_pids(job, "waiting")) <= survivor for job in waiting)


def test_a_cancel_reaching_a_step_claimed_ahead_stops_it_from_starting(cluster: Cluster) -> None:
    blocker = cluster.schedule(probe.task(name="blocker", sleep=60, poll_cancel=True))
    victim = cluster.schedule(probe.task(name="victim"))
    after = cluster.schedule(probe.task(name="after"))
    cluster.start_worker(threads=1, extra_env=AHEAD)
    wait_for(lambda: cluster.stamp("running", blocker, "blocker"), 30, "the blocker to start")
    wait_for(lambda: claimed_ahead(cluster, [victim, after], blocker), 30, "claims ahead")

    Job.cancel_saved(victim.id)
    # The blocker's cancel travels after the victim's, by the same ways (a notice,
    # the lease renewal): once the blocker saw its own, the victim's was heard.
    Job.cancel_saved(blocker.id)
    records = cluster.wait_status(
        [blocker, victim, after], timeout=60, statuses=(Status.COMPLETED, Status.CANCELLED)
    )

    assert records[victim.id].status is Status.CANCELLED
    assert cluster.runs(victim, "victim") == 0
    assert records[after.id].status is Status.COMPLETED
    assert cluster.runs(after, "after") == 1


#: Steps run by the worker that is then SIGKILLed with their outcomes queued.
QUEUED = 6


def _sigkilled_with_outcomes_held(cluster: Cluster, where: str) -> list[Job]:
    """Run :data:`QUEUED` one-task jobs on a worker whose completion thread never does
    ``where`` (``record``, ``ack``); SIGKILL it once every task ran (and, for ``ack``,
    every outcome was recorded), start a survivor; the jobs."""
    lease = 2.0
    jobs = [cluster.schedule(probe.task(name="queued")) for _ in range(QUEUED)]
    crashed = cluster.start_worker(
        threads=2,
        lease_seconds=lease,
        heartbeat_timeout_ms=1000,
        extra_env={**AHEAD, ENV["hold_completion"]: where},
    )
    wait_for(lambda: all(cluster.runs(job, "queued") == 1 for job in jobs), 30, "every task to run")
    if where == "ack":
        cluster.wait_status(jobs, timeout=60)
    # The worker threads are done; every message waits for the completion thread.
    assert cluster.redis.hlen(f"dramatiq:{CHANNEL}.msgs") == QUEUED
    crashed.kill()
    cluster.start_worker(threads=2, lease_seconds=lease, heartbeat_timeout_ms=1000, extra_env=AHEAD)
    return jobs


def test_a_worker_sigkilled_with_outcomes_queued_has_each_step_run_again_once(
    cluster: Cluster,
) -> None:
    jobs = _sigkilled_with_outcomes_held(cluster, "record")
    records = cluster.wait_status(jobs, timeout=60)

    assert all(record.status is Status.COMPLETED for record in records.values()), records
    # None lost; each outcome was never recorded, so each task ran again, once.
    assert [cluster.runs(job, "queued") for job in jobs] == [2] * QUEUED
    survivor = cluster.workers[1].group_pids()
    assert all(cluster.run_pids(job, "queued")[1] in survivor for job in jobs)
    wait_for(lambda: not cluster.redis.hlen(f"dramatiq:{CHANNEL}.msgs"), 60, "every message acked")


def test_a_worker_sigkilled_between_record_and_ack_has_no_step_run_again(
    cluster: Cluster,
) -> None:
    jobs = _sigkilled_with_outcomes_held(cluster, "ack")

    # The dead worker's messages come back and are dropped unrun by the survivor.
    wait_for(lambda: not cluster.redis.hlen(f"dramatiq:{CHANNEL}.msgs"), 60, "every message acked")
    records = {job.id: cluster.saved(job) for job in jobs}
    assert all(record.status is Status.COMPLETED for record in records.values()), records
    assert [cluster.runs(job, "queued") for job in jobs] == [1] * QUEUED


#: Jobs, and plain actor messages beside them, of the load test.
LOAD = 150


def test_plain_actors_beside_steps_under_load_each_run_exactly_once(cluster: Cluster) -> None:
    jobs = [cluster.schedule(probe.task(name="load")) for _ in range(LOAD)]
    keys = [f"beside-{n}" for n in range(LOAD)]
    for key in keys:
        cluster.broker.enqueue(flaky_plain.message(key, 0))
    cluster.start_worker(threads=8, extra_env={ENV["claim_fetched"]: "1"})

    records = cluster.wait_status(jobs, timeout=120)
    wait_for(
        lambda: all(cluster.redis.get(f"plain-done:{key}") for key in keys),
        120,
        "every plain message to run",
    )
    wait_for(
        lambda: not cluster.redis.hlen(f"dramatiq:{CHANNEL}.msgs"), 60, "every step message acked"
    )

    assert all(record.status is Status.COMPLETED for record in records.values())
    assert [cluster.runs(job, "load") for job in jobs] == [1] * LOAD
    assert [cluster.redis.get(f"plain:{key}") for key in keys] == [b"1"] * LOAD
