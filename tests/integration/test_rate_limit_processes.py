"""A channel's rate limit counted across real ``dramatiq`` workers (two processes), on
Redis (the turns in Redis) and on RabbitMQ (the turns in PostgreSQL).

20 jobs queued at once on a channel limited to 5/s: every job completes with one
attempt (starts over the limit are delayed, not failed), both processes run some,
and the starts, as the probe stamps them when it begins, never come more than 5 in
a second: any 6 consecutive starts span a second, less the time a granted start
takes to reach the task (its claim, a store write; :data:`CLAIM_ALLOWANCE`). Two
processes each counting alone would start 10 in a second.

The workers move delayed messages every 100 ms (``dramatiq_worker_timeout``; Dramatiq's
default is 1 s), as docs/howto/rate-limits.md advises for limits of a few per second
and more: a held start comes back that much late at most.
"""

from __future__ import annotations

import pytest

from pypepper_dramatiq import Status

from .conftest import BROKERS_AND_STORES
from .harness import Cluster
from .worker_app import ENV, probe

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

#: The limit, and how many jobs are queued at once.
PER_SECOND = 5
JOBS = 20
#: Seconds a granted start may take to reach the task (the claim: a store write).
#: At most PER_SECOND starts are granted in any second when they ask; this is the
#: room for the variation of the time between that moment and the probe's first line.
CLAIM_ALLOWANCE = 0.1


def fixed_windows(starts: list[float]) -> list[int]:
    """How many starts fall in each second from the first one."""
    counts = [0] * (int(starts[-1] - starts[0]) + 1)
    for start in starts:
        counts[int(start - starts[0])] += 1
    return counts


@pytest.mark.parametrize(
    ("broker_kind", "store_backend"),
    [BROKERS_AND_STORES[0], BROKERS_AND_STORES[2]],
    indirect=True,
)
def test_a_rate_limit_is_counted_across_two_worker_processes(cluster: Cluster) -> None:
    cluster.start_worker(
        processes=2,
        threads=4,
        extra_env={ENV["rate_limit"]: f"{PER_SECOND}/s", "dramatiq_worker_timeout": "100"},
    )
    jobs = [cluster.schedule(probe.task(name="work", value=n)) for n in range(JOBS)]
    records = cluster.wait_status(jobs, 90)

    assert {r.status for r in records.values()} == {Status.COMPLETED}
    assert all(cluster.runs(job, "work") == 1 for job in jobs)
    for record in records.values():  # no attempt burnt while held
        assert all(len(entries) == 1 for entries in record.state["history"].values()), record
    pids = {pid for job in jobs for pid in cluster.run_pids(job, "work")}
    assert len(pids) == 2, pids  # counted across both processes

    starts = sorted(t for job in jobs for t in cluster.times("starts", job, "work"))
    assert len(starts) == JOBS
    spans = [starts[i + PER_SECOND] - starts[i] for i in range(JOBS - PER_SECOND)]
    assert min(spans) >= 1.0 - CLAIM_ALLOWANCE, (min(spans), fixed_windows(starts))
    print(
        f"starts per second from the first: {fixed_windows(starts)}; "
        f"shortest span of {PER_SECOND + 1} starts: {min(spans):.3f}s; "
        f"rate over the run: {(JOBS - 1) / (starts[-1] - starts[0]):.2f}/s"
    )
