"""Claims ahead (``claim_fetched``) with real ``dramatiq`` worker processes on Redis.

The consumer thread claims every step message of one fetch in one statement
before the worker threads take them. A step so claimed holds a lease while it
waits: these tests check that a worker SIGKILLed while holding such a batch has
each of its steps recovered by the lease and run once, and that a cancel reaching
a step claimed ahead stops it from starting.
"""

from __future__ import annotations

from pypepper_dramatiq import Job, Status

from .harness import Cluster, wait_for
from .worker_app import ENV, probe

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
