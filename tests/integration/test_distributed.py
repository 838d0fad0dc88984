"""Jobs run by real ``dramatiq`` worker processes on Redis, with their state in PostgreSQL.

Each test starts the stock CLI on ``worker_app`` and checks outcomes in the job
store from this process; ``worker_app.probe`` leaves per-execution traces in
Redis (run counters, timestamps), which is how "ran exactly once" is checked.
Tests that crash or restart a worker print their figures (``pytest -s``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import dramatiq
import pika
import pytest
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from services import PostgresServer, RabbitMQServer, RedisServer

from pypepper_dramatiq import Status, actor_task
from pypepper_dramatiq.channels.messages import OPTION_KEY, StepMessage
from pypepper_dramatiq.errors import BrokerUnavailableError
from pypepper_dramatiq.rules.start_times import SHORT_DELAY_SECONDS
from pypepper_dramatiq.rules.steps import Position

from .conftest import (
    BOTH_BROKERS,
    BROKERS_AND_STORES,
    empty_jobs_table,
    flush_redis,
)
from .harness import Cluster, wait_for
from .worker_app import CHANNEL, ENV, flaky_plain, probe

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]


def report(title: str, **figures: object) -> None:
    """Print one line of figures (visible with ``pytest -s``)."""
    print(f"\n[{title}] " + ", ".join(f"{k}={v}" for k, v in figures.items()))


@pytest.mark.parametrize(("broker_kind", "store_backend"), BROKERS_AND_STORES, indirect=True)
def test_results_flow_between_tasks_and_each_task_runs_once(cluster: Cluster) -> None:
    cluster.start_worker()
    job = cluster.schedule(
        probe.task(name="a", value=2),
        probe.task(name="b", value=10, add_to="a"),
        probe.task(name="c", value=100, add_to="b"),
    )

    record = cluster.wait_status([job], timeout=30)[job.id]

    assert record.state["results"] == {"0.0": 2, "0.1": 12, "0.2": 112}
    assert [cluster.runs(job, name) for name in "abc"] == [1, 1, 1]


@pytest.mark.parametrize("broker_kind", BOTH_BROKERS, indirect=True)
def test_two_workers_share_a_channel_and_run_every_task_once(cluster: Cluster) -> None:
    for _ in range(2):
        cluster.start_worker(threads=4, wait=False)
    for worker in cluster.workers:
        worker.wait_ready()
    # Each first task lasts long enough (30 x 0.5 s over 4 threads: about 4 s for one
    # process alone) that the other process, which fetches at least once a second, takes
    # some: with 50 ms tasks a process busy with the machine's other work missed them all.
    jobs = [
        cluster.schedule(
            probe.task(name="a", value=i, sleep=0.5), probe.task(name="b", value=1, add_to="a")
        )
        for i in range(30)
    ]

    records = cluster.wait_status(jobs, timeout=45)

    assert {records[j.id].state["results"]["0.1"] for j in jobs} == set(range(1, 31))
    runs = {(j.id, name): cluster.runs(j, name) for j in jobs for name in "ab"}
    assert set(runs.values()) == {1}, {k: v for k, v in runs.items() if v != 1}
    pids = {pid for job in jobs for name in "ab" for pid in cluster.run_pids(job, name)}
    assert len(pids) == 2, f"expected both worker processes to take jobs, saw pids {pids}"


def test_each_process_of_one_worker_holds_its_leases_under_its_own_name(
    cluster: Cluster,
) -> None:
    # Leases belong to processes: if two processes of one worker shared a lease
    # owner, a live sibling would keep renewing a dead process's steps and they
    # would never be recovered.
    # One message at a time per process: with claims ahead (the default) a process of
    # one thread prefetches 6, its fetch claimed at once, and its sibling finds none.
    cluster.start_worker(processes=2, threads=1, extra_env={"dramatiq_queue_prefetch": "1"})
    jobs = [cluster.schedule(probe.task(name="hold", sleep=2)) for _ in range(6)]

    def running_owners() -> dict[int, str] | None:
        """Lease owner by pid of the jobs running now, once two processes run one each."""
        found: dict[int, str] = {}
        for job in jobs:
            if cluster.stamp("running", job, "hold") and not cluster.times("ends", job, "hold"):
                owner = cluster.saved(job).lease_owner
                if owner is not None:
                    found[cluster.run_pids(job, "hold")[-1]] = owner
        return found if len(found) == 2 else None

    by_pid = wait_for(running_owners, 30, "both processes to run a job at once")
    assert len(set(by_pid.values())) == 2, by_pid
    for pid, owner in by_pid.items():
        assert f":{pid}:" in owner, (pid, owner)
    cluster.wait_status(jobs, timeout=30)


@pytest.mark.parametrize(("broker_kind", "store_backend"), BROKERS_AND_STORES, indirect=True)
def test_sigkilled_worker_is_recovered_without_rerunning_finished_tasks(
    cluster: Cluster,
) -> None:
    lease = 2.0
    crashed = cluster.start_worker(threads=4, lease_seconds=lease, sweep_interval=0.5)
    jobs = [
        cluster.schedule(
            probe.task(name="before", value=i),
            probe.task(name="long", sleep=4, value=1, add_to="before"),
            probe.task(name="after", value=0, add_to="long"),
        )
        for i in range(4)
    ]
    wait_for(
        lambda: all(cluster.stamp("running", j, "long") for j in jobs),
        30,
        "every job's long task to run",
    )

    crashed.kill()
    killed_at = time.time()
    assert not any(cluster.times("ends", j, "long") for j in jobs), "the crash came too late"
    cluster.start_worker(threads=4, lease_seconds=lease, sweep_interval=0.5)
    records = cluster.wait_status(jobs, timeout=45)
    recovered_in = time.time() - killed_at
    reruns = [cluster.times("starts", j, "long")[1:] for j in jobs]
    rerun_after = [round(r[0] - killed_at, 1) for r in reruns if r]

    assert {records[j.id].state["results"]["0.2"] for j in jobs} == {1, 2, 3, 4}
    for job in jobs:
        assert cluster.runs(job, "before") == 1, "a task finished before the crash ran again"
        assert cluster.runs(job, "long") in (1, 2)
        assert cluster.runs(job, "after") == 1
    duplicates = sum(cluster.runs(j, n) - 1 for j in jobs for n in ("before", "long", "after"))
    report(
        "sigkill",
        jobs_submitted=len(jobs),
        completed=len(records),
        duplicated_executions=duplicates,
        rerun_started_after_kill_s=rerun_after,
        all_completed_after_kill_s=f"{recovered_in:.1f}",
        lease_s=lease,
    )


@pytest.mark.parametrize("broker_kind", BOTH_BROKERS, indirect=True)
def test_cancel_reaches_a_polling_task_quickly_and_the_job_ends_cancelled(
    cluster: Cluster,
) -> None:
    cluster.start_worker(debug_steps=True)
    job = cluster.schedule(
        probe.task(name="poll", sleep=30, poll_cancel=True), probe.task(name="never")
    )
    wait_for(lambda: cluster.stamp("running", job, "poll"), 30, "the task to start")

    cancelled_at = time.time()
    assert job.cancel()
    seen = wait_for(lambda: cluster.stamp("cancel_seen", job, "poll"), 10, "the task to notice")
    wait_for(lambda: cluster.times("ends", job, "poll"), 10, "the task to return")

    latency = seen - cancelled_at
    report("cancel", latency_s=f"{latency:.3f}")
    assert latency < 1.0
    # The task returned normally: recording its outcome must lose to the cancel.
    wait_for(
        lambda: (
            f"job {job.id}: the outcome of task poll was not recorded: the job was cancelled"
            in cluster.logs()
        ),
        10,
        "the outcome write",
    )
    record = cluster.saved(job)
    assert record.status is Status.CANCELLED, record
    assert cluster.runs(job, "never") == 0


@pytest.mark.parametrize("broker_kind", BOTH_BROKERS, indirect=True)
def test_the_cancel_command_reaches_a_running_task_from_another_process(
    cluster: Cluster,
) -> None:
    # A long lease: lease renewal (every 20 s) cannot be what tells the task.
    cluster.start_worker(lease_seconds=60)
    job = cluster.schedule(
        probe.task(name="poll", sleep=30, poll_cancel=True), probe.task(name="never")
    )
    wait_for(lambda: cluster.stamp("running", job, "poll"), 30, "the task to start")

    command = subprocess.run(
        [
            str(Path(sys.executable).with_name("pypepper-dramatiq")),
            "cancel",
            job.id,
            "--uri",
            cluster.store_uri,
            "--broker-url",
            cluster.broker_url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    returned_at = time.time()
    assert command.returncode == 0, command.stderr
    assert "running tasks were told" in command.stdout
    seen = wait_for(lambda: cluster.stamp("cancel_seen", job, "poll"), 10, "the task to notice")

    report("cancel-command", seen_after_command_returned_s=f"{seen - returned_at:.3f}")
    assert seen - returned_at < 1.0
    wait_for(lambda: cluster.saved(job).status is Status.CANCELLED, 10, "the row")
    wait_for(lambda: cluster.times("ends", job, "poll"), 10, "the task to return")
    assert cluster.runs(job, "never") == 0


@pytest.mark.parametrize("broker_kind", BOTH_BROKERS, indirect=True)
def test_a_task_ignoring_its_cancel_is_interrupted_after_the_grace_period(
    cluster: Cluster,
) -> None:
    grace = 1.0
    cluster.start_worker(threads=1, cancel_grace=grace)
    job = cluster.schedule(probe.task(name="stubborn", sleep=30))
    wait_for(lambda: cluster.stamp("running", job, "stubborn"), 30, "the task to start")

    cancelled_at = time.time()
    assert job.cancel()
    interrupted = wait_for(
        lambda: cluster.redis.get(f"interrupted:{job.id}:stubborn"), 15, "the interrupt"
    ).decode()

    when, exception = interrupted.split()
    report(
        "cancel-grace",
        grace_s=grace,
        interrupted_after_s=f"{float(when) - cancelled_at:.2f}",
        exception=exception,
    )
    assert exception == "StepCancelled"
    assert grace <= float(when) - cancelled_at < grace + 5
    # The only worker thread is free again: a new job runs long before the 30 s task would end.
    follower = cluster.schedule(probe.task(name="next"))
    cluster.wait_status([follower], timeout=15)
    assert cluster.saved(job).status is Status.CANCELLED


@pytest.mark.parametrize("broker_kind", BOTH_BROKERS, indirect=True)
def test_a_job_cancelled_while_queued_never_starts(cluster: Cluster) -> None:
    job = cluster.schedule(probe.task(name="queued"))
    assert job.cancel()
    sentinel = cluster.schedule(probe.task(name="sentinel"))

    cluster.start_worker(threads=1)
    cluster.wait_status([sentinel], timeout=30)

    assert cluster.saved(job).status is Status.CANCELLED
    assert cluster.runs(job, "queued") == 0


def test_a_retry_delay_does_not_block_a_one_thread_worker(cluster: Cluster) -> None:
    cluster.start_worker(threads=1)
    delayed = cluster.schedule(
        probe.options(retry_count=1, retry_delay=5).task(name="a", fail_times=1, value="A")
    )
    wait_for(lambda: cluster.times("ends", delayed, "a"), 30, "the first attempt to fail")
    quick = cluster.schedule(probe.task(name="b", value="B"))

    cluster.wait_status([quick], timeout=15)
    quick_done = max(cluster.times("ends", quick, "b"))
    records = cluster.wait_status([delayed], timeout=20)

    first, second = cluster.times("starts", delayed, "a")
    report(
        "retry-delay",
        b_done_after_a_failed_s=f"{quick_done - first:.2f}",
        a_retried_after_s=f"{second - first:.2f}",
    )
    assert quick_done < second, "B waited behind A's retry delay"
    assert second - first >= 5 - 0.5
    assert records[delayed.id].state["results"] == {"0.0": "A"}


def test_sigterm_during_a_long_task_and_the_job_still_completes(cluster: Cluster) -> None:
    stopping = cluster.start_worker()
    job = cluster.schedule(
        probe.task(name="long", sleep=3, value=1), probe.task(name="after", value=1, add_to="long")
    )
    wait_for(lambda: cluster.stamp("running", job, "long"), 30, "the long task to start")
    stopping_pids = stopping.group_pids()

    exited_after = stopping.stop_gracefully(timeout=30)
    cluster.start_worker()
    records = cluster.wait_status([job], timeout=30)

    by_stopping = [p for p in cluster.run_pids(job, "long") if p in stopping_pids]
    report(
        "sigterm",
        worker_exited_after_s=f"{exited_after:.1f}",
        long_runs=cluster.runs(job, "long"),
        long_runs_by_stopping_worker=len(by_stopping),
        after_runs=cluster.runs(job, "after"),
    )
    assert records[job.id].state["results"]["0.1"] == 2
    assert cluster.runs(job, "long") in (1, 2)  # finished by the stopping worker, or handed back
    assert cluster.runs(job, "after") == 1


def test_a_stopping_worker_does_not_rerun_the_step_it_handed_back(cluster: Cluster) -> None:
    task_seconds = 8.0
    stopping = cluster.start_worker(threads=2)
    job = cluster.schedule(probe.task(name="long", sleep=task_seconds))
    wait_for(lambda: cluster.stamp("running", job, "long"), 30, "the long task to start")
    stopping_pids = stopping.group_pids()

    exited_after = stopping.stop_gracefully(timeout=30)

    by_stopping = [p for p in cluster.run_pids(job, "long") if p in stopping_pids]
    report(
        "sigterm-self-rerun",
        worker_exited_after_s=f"{exited_after:.1f}",
        runs_by_stopping_worker=len(by_stopping),
    )
    assert len(by_stopping) == 1
    assert exited_after < task_seconds


def test_sigterm_hands_the_step_to_a_running_worker_before_its_lease_lapses(
    cluster: Cluster,
) -> None:
    lease = 15.0
    stopping = cluster.start_worker(lease_seconds=lease)
    job = cluster.schedule(probe.task(name="long", sleep=4, value=1))
    wait_for(lambda: cluster.stamp("running", job, "long"), 30, "the long task to start")
    cluster.start_worker(lease_seconds=lease)

    signalled_at = time.time()
    stopping.terminate()
    cluster.wait_status([job], timeout=30)
    stopping.wait_exit(timeout=30)

    starts = cluster.times("starts", job, "long")
    interrupted = cluster.redis.get(f"interrupted:{job.id}:long")
    report(
        "sigterm-handback",
        long_runs=len(starts),
        restarted_after_s=f"{starts[-1] - signalled_at:.2f}" if len(starts) > 1 else "-",
        interrupted=interrupted,
    )
    if len(starts) == 2:  # handed back: the other worker took it at once, not after the lease
        assert interrupted is not None and interrupted.split()[1] == b"Shutdown"
        assert starts[1] - signalled_at < lease / 2
    else:  # or the stopping worker finished it
        assert len(starts) == 1 and interrupted is None


@pytest.mark.parametrize("broker_kind", BOTH_BROKERS, indirect=True)
def test_plain_actor_keeps_dramatiq_retries_under_our_middleware(cluster: Cluster) -> None:
    worker = cluster.start_worker()
    cluster.broker.enqueue(flaky_plain.message("retried", 2))

    succeeded_on = wait_for(lambda: cluster.redis.get("plain-done:retried"), 20, "a success")

    assert succeeded_on == b"3"  # two failures retried by Dramatiq's Retries, then success
    assert cluster.redis.get("plain:retried") == b"3"
    pids = {int(p) for p in cluster.redis.smembers("plain-pids:retried")}
    assert len(pids) == 1 and pids <= worker.group_pids(), "retried elsewhere"


@pytest.mark.parametrize("broker_kind", BOTH_BROKERS, indirect=True)
def test_plain_actor_runs_as_a_workflow_task(cluster: Cluster) -> None:
    cluster.start_worker()
    job = cluster.schedule(actor_task(flaky_plain, retry_count=1, key="as-task", failures=1))

    records = cluster.wait_status([job], timeout=30)

    # One failure retried by the task's retry table (not by Dramatiq's Retries), then success.
    assert cluster.redis.get("plain:as-task") == b"2"
    assert records[job.id].state["results"] == {"0.0": 2}
    assert records[job.id].state["attempts"] == {"0.0": 2}


def _queued_steps(cluster: Cluster) -> dict[str, tuple[list[int], int]]:
    """Step messages in the channel's ``.msgs`` hash: job id -> (position, encoded size)."""
    found = {}
    for raw in cluster.redis.hgetall(f"dramatiq:{CHANNEL}.msgs").values():
        data = json.loads(raw)["options"].get(OPTION_KEY)
        if data is not None:
            found[data["job"]] = (data["pos"], len(raw))
    return found


def test_later_step_messages_do_not_grow_with_the_job(cluster: Cluster) -> None:
    # One message per step (no continuation): the second step's own message is measured.
    cluster.start_worker(threads=2, extra_env={ENV["continue_steps"]: "0"})
    jobs = {}
    for size in (2, 100):
        tasks = [probe.task(name="t0")]
        tasks += [probe.task(name=f"t{i}", sleep=30, poll_cancel=True) for i in range(1, size)]
        jobs[size] = cluster.schedule(*tasks)
    for job in jobs.values():
        wait_for(lambda job=job: cluster.stamp("running", job, "t1"), 30, "the second step")

    # A running step's message stays in the hash until it is acknowledged.
    steps = _queued_steps(cluster)
    small, large = steps[jobs[2].id], steps[jobs[100].id]
    first = StepMessage(jobs[100].id, Position(), jobs[100].to_record()).to_message(CHANNEL)
    report(
        "message-size",
        step1_of_2_tasks=small[1],
        step1_of_100_tasks=large[1],
        first_message_of_100_tasks=len(first.encode()),
    )
    assert small[0] == large[0] == [0, 1, 0, 0]
    assert small[1] == large[1]
    assert large[1] * 10 < len(first.encode())
    for job in jobs.values():
        assert job.cancel()
    cluster.wait_status(jobs.values(), timeout=15, statuses=[Status.CANCELLED])


def test_a_thousand_task_job_schedules_and_encodes(cluster: Cluster) -> None:
    tasks = [probe.task(name=f"t{i}", value=i) for i in range(1000)]
    job = cluster.schedule(*tasks)

    record = cluster.saved(job)
    assert record.status is Status.SCHEDULED
    assert len(record.payload["workflows"][0]["tasks"]) == 1000
    (raw,) = cluster.redis.hgetall(f"dramatiq:{CHANNEL}.msgs").values()
    decoded = StepMessage.from_message(dramatiq.Message.decode(raw))
    assert decoded.job_id == job.id and decoded.record is not None
    assert decoded.record.payload == record.payload
    later = StepMessage(job.id, Position(0, 999)).to_message(CHANNEL).encode()
    assert len(later) < 1024


def test_queued_jobs_survive_a_redis_restart(
    own_redis: RedisServer, postgres_uri: str, tmp_path: Path
) -> None:
    empty_jobs_table(postgres_uri)
    cluster = Cluster(own_redis.url, postgres_uri, tmp_path)
    try:
        jobs = [cluster.schedule(probe.task(name="only", value=i)) for i in range(20)]
        queued = cluster.redis.hlen(f"dramatiq:{CHANNEL}.msgs")
        cluster.redis.close()

        own_redis.stop()  # SIGTERM: Redis flushes its append-only file and exits
        own_redis.start()
        requeued = cluster.redis.hlen(f"dramatiq:{CHANNEL}.msgs")
        cluster.start_worker(threads=4)
        records = cluster.wait_status(jobs, timeout=40)

        runs = [cluster.runs(j, "only") for j in jobs]
        report(
            "redis-restart",
            jobs_submitted=len(jobs),
            queued_before=queued,
            queued_after=requeued,
            completed=len(records),
            duplicates=sum(runs) - len(runs),
        )
        assert queued == requeued == 20
        assert runs == [1] * 20
        assert sorted(r.state["results"]["0.0"] for r in records.values()) == list(range(20))
    finally:
        cluster.close()


def rabbitmq_queued(url: str, queue: str) -> int:
    """How many messages wait in ``queue`` (ready ones), asked on a connection of its own."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        declared = connection.channel().queue_declare(queue, passive=True)
        return int(declared.method.message_count)
    finally:
        connection.close()


@pytest.mark.rabbitmq
def test_queued_jobs_survive_a_rabbitmq_restart(
    own_rabbitmq: RabbitMQServer, redis_url: str, postgres_uri: str, tmp_path: Path
) -> None:
    # Durable queues, persistent messages, and publisher confirms (send() returned once
    # RabbitMQ held each message): a clean restart keeps every queued job.
    flush_redis(redis_url)
    empty_jobs_table(postgres_uri)
    cluster = Cluster(redis_url, postgres_uri, tmp_path, own_rabbitmq.url)
    assert isinstance(cluster.broker, RabbitmqBroker)
    try:
        jobs = [cluster.schedule(probe.task(name="only", value=i)) for i in range(20)]
        queued = rabbitmq_queued(own_rabbitmq.url, CHANNEL)

        own_rabbitmq.restart()  # the producer's connection is cut
        requeued = rabbitmq_queued(own_rabbitmq.url, CHANNEL)
        after = cluster.schedule(probe.task(name="only", value=20))  # it reconnects by itself
        cluster.start_worker(threads=4)
        records = cluster.wait_status([*jobs, after], timeout=40)

        runs = [cluster.runs(j, "only") for j in [*jobs, after]]
        report(
            "rabbitmq-restart",
            jobs_submitted=len(jobs) + 1,
            queued_before=queued,
            queued_after=requeued,
            completed=len(records),
            duplicates=sum(runs) - len(runs),
        )
        assert queued == requeued == 20
        assert runs == [1] * 21
        assert sorted(r.state["results"]["0.0"] for r in records.values()) == list(range(21))
    finally:
        cluster.close()


@pytest.mark.parametrize("broker_kind", BOTH_BROKERS, indirect=True)
def test_jobs_complete_across_a_postgres_restart(
    own_postgres: PostgresServer, redis_url: str, broker_url: str, tmp_path: Path
) -> None:
    flush_redis(redis_url)
    cluster = Cluster(redis_url, own_postgres.uri, tmp_path, broker_url)
    try:
        worker = cluster.start_worker(threads=2, lease_seconds=3)
        names = ("first", "second")
        jobs = [
            cluster.schedule(*(probe.task(name=n, sleep=0.2, value=i) for n in names))
            for i in range(20)
        ]
        wait_for(
            lambda: sum(bool(cluster.times("ends", j, "second")) for j in jobs) >= 3,
            30,
            "a few jobs to finish before the outage",
        )

        down_at = time.time()
        # "fast" cuts every connection at once but keeps what was committed; "immediate"
        # would also drop the last commits here (the test cluster runs with
        # synchronous_commit=off), rerunning tasks whose outcome had been stored.
        own_postgres.stop(mode="fast")
        time.sleep(2)  # the outage itself: workers keep taking messages meanwhile
        own_postgres.start()
        up_at = time.time()
        records = cluster.wait_status(jobs, timeout=45)

        runs = {(j.id, n): cluster.times("ends", j, n) for j in jobs for n in names}
        duplicated = {k: ends for k, ends in runs.items() if len(ends) > 1}
        report(
            "postgres-restart",
            jobs_submitted=len(jobs),
            completed=len(records),
            duplicated_executions=sum(len(e) - 1 for e in duplicated.values()),
            outage_s=f"{up_at - down_at:.1f}",
            rerun_first_ended_s=sorted(round(e[0] - down_at, 2) for e in duplicated.values()),
        )
        assert all(len(ends) >= 1 for ends in runs.values())
        # At least once only for what was in flight: a rerun task's first attempt ended
        # when its outcome could no longer be written (margin for a slow write).
        finished_before = {k: e for k, e in duplicated.items() if e[0] < down_at - 0.5}
        assert not finished_before, f"tasks finished before the outage ran again: {finished_before}"
        assert sorted(r.state["results"]["0.1"] for r in records.values()) == list(range(20))
        assert worker.proc.poll() is None, "the worker died with the database"
    finally:
        cluster.close()


@pytest.mark.parametrize("broker_kind", BOTH_BROKERS, indirect=True)
def test_jobs_submitted_while_postgres_is_down(
    own_postgres: PostgresServer,
    redis_url: str,
    broker_kind: str,
    broker_url: str,
    tmp_path: Path,
) -> None:
    # On Redis the channel's admission lives in Redis and the first message carries the
    # job's record: the producer's row write fails, the message is queued anyway, and
    # the worker that takes it writes the row (a heal) once the database answers. On
    # RabbitMQ the admission lives in PostgreSQL: each job is refused with
    # BrokerUnavailableError, nothing of it queued, and jobs run again once it is back.
    flush_redis(redis_url)
    cluster = Cluster(redis_url, own_postgres.uri, tmp_path, broker_url)
    try:
        cluster.start_worker(threads=2, lease_seconds=3, defer_seconds=0.5)
        before = cluster.schedule(probe.task(name="only", value=-1))
        cluster.wait_status([before], timeout=30)

        own_postgres.stop(mode="fast")
        accepted, refused = [], []
        for i in range(5):
            try:
                accepted.append(cluster.schedule(probe.task(name="only", value=i)))
            except BrokerUnavailableError as exc:
                refused.append(str(exc))
        time.sleep(1)  # workers take what was queued while the database is down
        own_postgres.start()
        later = [cluster.schedule(probe.task(name="only", value=i)) for i in range(5, 7)]
        records = cluster.wait_status([*accepted, *later], timeout=45)

        runs = [cluster.runs(j, "only") for j in [*accepted, *later]]
        report(
            "submitted-while-postgres-down",
            broker=broker_kind,
            accepted=len(accepted),
            refused=len(refused),
            runs=runs,
        )
        assert runs == [1] * len(runs)
        results = sorted(r.state["results"]["0.0"] for r in records.values())
        if broker_kind == "redis":
            assert not refused and results == list(range(7))
        else:
            assert not accepted and len(refused) == 5 and results == [5, 6]
            assert all("PostgreSQL unreachable" in why for why in refused), refused
    finally:
        cluster.close()


def delayed_messages(cluster: Cluster) -> int:
    """How many messages wait in the test channel's delay queue (Dramatiq's own)."""
    if cluster.broker_url.startswith("amqp"):
        return rabbitmq_queued(cluster.broker_url, f"{CHANNEL}.DQ")
    return int(cluster.redis.hlen(f"dramatiq:{CHANNEL}.DQ.msgs"))


@pytest.mark.parametrize("broker_kind", BOTH_BROKERS, indirect=True)
def test_a_short_delay_waits_in_the_brokers_delay_queue_and_a_long_one_in_the_store(
    cluster: Cluster,
) -> None:
    short = cluster.schedule_in(2, probe.task(name="short"))
    long = cluster.schedule_in(SHORT_DELAY_SECONDS + 2, probe.task(name="long"))

    assert cluster.saved(short).release_at is None  # its message went, delayed
    assert cluster.saved(long).release_at is not None  # held: no message yet
    assert delayed_messages(cluster) == 1
    cluster.start_worker(sweep_interval=0.5)
    records = cluster.wait_status([short, long], timeout=SHORT_DELAY_SECONDS + 30)

    for job, name in ((short, "short"), (long, "long")):
        planned = records[job.id].not_before
        assert planned is not None
        assert cluster.times("starts", job, name)[0] >= planned.timestamp(), name
        assert cluster.runs(job, name) == 1
