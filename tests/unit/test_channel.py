"""Channels: bounds, send results, stop semantics, and the Dramatiq queue underneath."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import datetime, timezone
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker

from pypepper_dramatiq import (
    CallableExecutor,
    Channel,
    ChannelEnqueueError,
    ChannelFullError,
    ChannelStoppedError,
    ConfigError,
    Job,
    Status,
    Task,
    Worker,
    Workflow,
    executor_registry,
    manager,
)
from pypepper_dramatiq import channel as channel_module
from pypepper_dramatiq.rules.events import INIT, SCHEDULE

FIXED_TIME = datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=timezone.utc)


def make_job(channel_id: str = "chan", tasks: int = 1, func: Any = None, **kw: Any) -> Job:
    """A job with one workflow of ``tasks`` CallableExecutor tasks."""
    job = Job(category="test", channel_id=channel_id, **kw)
    workflow = Workflow()
    for i in range(tasks):
        workflow.add_task(
            Task(
                channel_id=channel_id,
                dag_id="dag",
                fingerprint=f"fp-{i}",
                name=f"task-{i}",
                category="test",
                description="",
                tags=[],
                executor=CallableExecutor(func or (lambda task, context: task.name)),
            )
        )
    job.workflows.append(workflow)
    return job


def send(channel: Channel, job: Job) -> str:
    return asyncio.run(channel.send(job))


def drain(channel: Channel) -> list[Job]:
    async def go() -> list[Job]:
        jobs = []
        while (job := await channel.receive()) is not None:
            jobs.append(job)
        return jobs

    assert channel.stop, "drain() is for stopped channels"
    return asyncio.run(go())


# -- bounds -----------------------------------------------------------------------------------


def test_new_with_maxsize_bounds_the_channel() -> None:
    channel = manager.new("bounded", maxsize=2)
    results = [send(channel, make_job("bounded")) for _ in range(3)]
    assert results == ["ok", "ok", "full"]
    assert channel.length() == 2


def test_later_maxsize_on_an_existing_channel_is_ignored() -> None:
    first = manager.new("bounded", maxsize=1)
    again = manager.new("bounded", maxsize=10)
    also = manager.available("bounded", maxsize=10)
    assert again is first
    assert also is first
    assert send(first, make_job("bounded")) == "ok"
    assert send(first, make_job("bounded")) == "full"


def test_available_on_first_create_honours_maxsize() -> None:
    channel = manager.available("fresh", maxsize=1)
    assert manager.get("fresh") is channel
    assert send(channel, make_job("fresh")) == "ok"
    assert send(channel, make_job("fresh")) == "full"


def test_default_channel_is_unbounded() -> None:
    channel = manager.available("open")
    assert all(send(channel, make_job("open")) == "ok" for _ in range(50))
    assert channel.length() == 50


def test_resize_changes_the_bound_of_a_created_channel() -> None:
    channel = manager.new("resized", maxsize=1)
    assert send(channel, make_job("resized")) == "ok"
    assert send(channel, make_job("resized")) == "full"

    assert manager.new("resized", maxsize=3) is channel  # still ignored: same instance
    assert channel.maxsize == 1
    assert manager.resize("resized", 3) == 1  # explicit: the bound it replaced

    assert channel.maxsize == 3
    assert [send(channel, make_job("resized")) for _ in range(3)] == ["ok", "ok", "full"]
    assert channel.resize(0) == 3
    assert send(channel, make_job("resized")) == "ok"


def test_resize_of_an_unknown_channel_creates_it_bounded() -> None:
    assert manager.resize("made-by-resize", 2) == 0
    channel = manager.get("made-by-resize")
    assert channel is not None and channel.maxsize == 2


@pytest.mark.parametrize("maxsize", [-1, "3", 2.5, True, None])
def test_resize_refuses_a_bad_bound_and_changes_nothing(maxsize: object) -> None:
    channel = manager.new("kept", maxsize=2)
    with pytest.raises(ConfigError, match="maxsize"):
        channel.resize(maxsize)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="maxsize"):
        manager.resize("kept", maxsize)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="maxsize"):
        manager.resize("never-made", maxsize)  # type: ignore[arg-type]
    assert channel.maxsize == 2
    assert manager.get("never-made") is None


def test_resume_accepts_jobs_again_after_a_stop() -> None:
    channel = manager.new("paused", maxsize=2)
    channel.request_stop()
    assert send(channel, make_job("paused")) == "stopped"

    manager.resume("paused")

    assert not channel.stop
    job = make_job("paused")
    job.scheduled()
    assert job.status is Status.SCHEDULED
    channel.request_stop()
    channel.resume()
    assert send(channel, make_job("paused")) == "ok"
    assert send(channel, make_job("paused")) == "full"


def test_a_channel_without_a_given_bound_is_unbounded() -> None:
    channel = manager.new("no-bound", maxsize=None)
    assert channel.maxsize == 0
    assert all(send(channel, make_job("no-bound")) == "ok" for _ in range(20))


def test_negative_maxsize_is_rejected() -> None:
    with pytest.raises(ValueError):
        manager.new("neg", maxsize=-1)


# -- send results and Job.scheduled() errors --------------------------------------------------


@pytest.mark.parametrize("maxsize", ["3", 2.5, True])
def test_a_maxsize_that_is_not_a_whole_number_is_a_config_error(maxsize: object) -> None:
    with pytest.raises(ConfigError, match="maxsize"):
        manager.new("typed", maxsize=maxsize)  # type: ignore[arg-type]
    assert manager.get("typed") is None


def test_send_returns_ok_full_and_stopped_strings() -> None:
    channel = manager.new("c", maxsize=1)
    assert send(channel, make_job("c")) == "ok"
    assert send(channel, make_job("c")) == "full"
    channel.request_stop()
    assert send(channel, make_job("c")) == "stopped"


def test_stopped_wins_over_full() -> None:
    channel = manager.new("c", maxsize=1)
    assert send(channel, make_job("c")) == "ok"
    channel.request_stop()
    assert send(channel, make_job("c")) == "stopped"


def test_full_and_stopped_errors_are_siblings_under_enqueue_error() -> None:
    assert issubclass(ChannelFullError, ChannelEnqueueError)
    assert issubclass(ChannelStoppedError, ChannelEnqueueError)
    assert not issubclass(ChannelStoppedError, ChannelFullError)
    assert not issubclass(ChannelFullError, ChannelStoppedError)


def test_scheduled_on_a_full_channel_raises_rolls_back_and_can_be_retried() -> None:
    channel = manager.new("c", maxsize=1)
    first = make_job("c")
    first.scheduled()
    second = make_job("c")
    with pytest.raises(ChannelFullError) as info:
        second.scheduled()
    assert not isinstance(info.value, ChannelStoppedError)
    assert second.status is Status.UNKNOWN
    assert Job.get_saved(second.id) is None
    assert channel.length() == 1

    assert asyncio.run(Worker(channel).run_once()) is first  # frees the slot
    second.scheduled()
    assert second.status is Status.SCHEDULED
    saved = Job.get_saved(second.id)
    assert saved is not None and saved.status == "Scheduled"
    assert channel.length() == 1


def test_scheduled_on_a_stopped_channel_raises_and_rolls_back() -> None:
    channel = manager.new("c")
    channel.request_stop()
    job = make_job("c")
    with pytest.raises(ChannelStoppedError) as info:
        job.scheduled()
    assert isinstance(info.value, ChannelEnqueueError)
    assert not isinstance(info.value, ChannelFullError)
    assert job.status is Status.UNKNOWN
    assert Job.get_saved(job.id) is None
    assert channel.length() == 0


def test_successful_scheduled_persists_scheduled() -> None:
    job = make_job("c")
    job.scheduled()
    assert job.status is Status.SCHEDULED
    saved = Job.get_saved(job.id)
    assert saved is not None
    assert saved.status == "Scheduled"
    assert manager.available("c").length() == 1


# -- stop -------------------------------------------------------------------------------------


def test_request_stop_sets_a_read_only_stop() -> None:
    channel = manager.new("c")
    assert channel.stop is False
    channel.request_stop()
    assert channel.stop is True
    with pytest.raises(AttributeError):
        channel.stop = False  # type: ignore[misc]
    assert channel.stop is True


def test_request_stop_wakes_a_blocked_receive(monkeypatch: pytest.MonkeyPatch) -> None:
    # Long poll interval: only the wake-up event can end the wait promptly.
    monkeypatch.setattr(channel_module, "POLL_INTERVAL", 5.0)
    channel = manager.new("c")

    async def go() -> tuple[Any, float]:
        task = asyncio.create_task(channel.receive())
        await asyncio.sleep(0.2)
        assert not task.done()
        stopper = threading.Thread(target=channel.request_stop)
        started = time.monotonic()
        stopper.start()
        result = await asyncio.wait_for(task, 4)
        stopper.join()
        return result, time.monotonic() - started

    result, elapsed = asyncio.run(go())
    assert result is None
    assert elapsed < 1.0


def test_a_send_wakes_a_blocked_receive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(channel_module, "POLL_INTERVAL", 5.0)
    channel = manager.new("c")
    job = make_job("c")

    async def go() -> tuple[Any, float]:
        task = asyncio.create_task(channel.receive())
        await asyncio.sleep(0.2)
        started = time.monotonic()
        sender = threading.Thread(target=job.scheduled)
        sender.start()
        result = await asyncio.wait_for(task, 4)
        sender.join()
        return result, time.monotonic() - started

    received, elapsed = asyncio.run(go())
    assert received is job
    assert elapsed < 1.0


def test_request_stop_occupies_no_queue_slot() -> None:
    channel = manager.new("c", maxsize=1)
    job = make_job("c")
    job.scheduled()
    channel.request_stop()  # must not need (or take) room on a full channel
    assert channel.length() == 1
    assert drain(channel) == [job]
    assert channel.length() == 0


def test_receive_on_a_stopped_channel_returns_queued_jobs_then_none() -> None:
    channel = manager.new("c")
    jobs = [make_job("c") for _ in range(2)]
    for job in jobs:
        job.scheduled()
    channel.request_stop()

    async def go() -> list[Any]:
        return [await channel.receive(), await channel.receive(), await channel.receive()]

    first, second, third = asyncio.run(go())
    assert [first, second] == jobs
    assert third is None


def test_stop_is_not_cancel_queued_jobs_still_complete() -> None:
    channel = manager.new("c")
    jobs = [make_job("c") for _ in range(3)]
    for job in jobs:
        job.scheduled()
    channel.request_stop()
    asyncio.run(asyncio.wait_for(Worker(channel).run_forever(), 5))
    for job in jobs:
        assert job.status is Status.COMPLETED
        assert not job.cancel_event.is_set()
        saved = Job.get_saved(job.id)
        assert saved is not None and saved.status == "Completed"


def test_send_and_request_stop_are_serialized() -> None:
    channel = manager.new("race")
    senders = 8
    barrier = threading.Barrier(senders + 2)
    stop_returned = threading.Event()
    lock = threading.Lock()
    records: list[tuple[str, str, bool]] = []  # (job id, result, stop had returned before)
    consumed: list[Job] = []

    def sender() -> None:
        async def loop() -> None:
            barrier.wait()
            for _ in range(5000):
                job = make_job("race")
                before = stop_returned.is_set()
                result = await channel.send(job)
                with lock:
                    records.append((job.id, result, before))
                if result == "stopped":
                    return

        asyncio.run(loop())

    def consumer() -> None:
        # Runs during the race and ends at the first None (stopped and empty): a job
        # enqueued after the stop was seen would be left behind.
        async def loop() -> None:
            barrier.wait()
            while (job := await channel.receive()) is not None:
                consumed.append(job)

        asyncio.run(loop())

    threads = [threading.Thread(target=sender) for _ in range(senders)]
    threads.append(threading.Thread(target=consumer))
    for thread in threads:
        thread.start()
    barrier.wait()
    time.sleep(0.1)
    channel.request_stop()
    stop_returned.set()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()

    results = {result for _, result, _ in records}
    assert results <= {"ok", "stopped"}
    assert "stopped" in results
    assert not [r for r in records if r[1] == "ok" and r[2]], "ok send after request_stop"
    ok_ids = {job_id for job_id, result, _ in records if result == "ok"}
    assert ok_ids
    assert len(consumed) == len(ok_ids)
    assert {job.id for job in consumed} == ok_ids
    assert channel.length() == 0
    assert drain(channel) == []


# -- Worker loop ------------------------------------------------------------------------------


def test_run_forever_does_not_exit_on_an_idle_open_queue_and_exits_after_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(channel_module, "POLL_INTERVAL", 5.0)
    channel = manager.new("c")

    async def go() -> tuple[bool, float]:
        task = asyncio.create_task(Worker(channel).run_forever())
        await asyncio.sleep(0.3)
        still_running = not task.done()
        started = time.monotonic()
        await asyncio.to_thread(channel.request_stop)
        await asyncio.wait_for(task, 4)
        return still_running, time.monotonic() - started

    still_running, elapsed = asyncio.run(go())
    assert still_running
    assert elapsed < 1.0  # woken by the stop, not by the next poll


def test_run_forever_processes_jobs_sent_while_it_waits() -> None:
    channel = manager.new("c")
    job = make_job("c")

    async def go() -> None:
        task = asyncio.create_task(Worker(channel).run_forever())
        await asyncio.sleep(0.1)
        await asyncio.to_thread(job.scheduled)
        for _ in range(100):
            if job.status is Status.COMPLETED:
                break
            await asyncio.sleep(0.02)
        assert not task.done()
        channel.request_stop()
        await asyncio.wait_for(task, 3)

    asyncio.run(go())
    assert job.status is Status.COMPLETED


def test_run_once_returns_none_when_stopped_and_empty() -> None:
    channel = manager.new("c")
    channel.request_stop()
    assert asyncio.run(Worker(channel).run_once()) is None


def test_run_once_on_a_stopped_channel_still_processes_a_queued_job() -> None:
    channel = manager.new("c")
    job = make_job("c")
    job.scheduled()
    channel.request_stop()
    worker = Worker(channel)
    assert asyncio.run(worker.run_once()) is job
    assert job.status is Status.COMPLETED
    assert asyncio.run(worker.run_once()) is None


def test_length_counts_waiting_jobs() -> None:
    channel = manager.new("c")
    assert channel.length() == 0
    for _ in range(3):
        make_job("c").scheduled()
    assert channel.length() == 3
    assert channel.take() is not None
    assert channel.length() == 2
    asyncio.run(Worker(channel).run_once())
    assert channel.length() == 1


# -- the Dramatiq queue underneath ------------------------------------------------------------


def queued_messages(stub: StubBroker, queue: str) -> list[dramatiq.Message[Any]]:
    return [dramatiq.Message.decode(raw) for raw in list(stub.queues[queue].queue)]


def test_channel_is_a_dramatiq_queue_on_the_broker(fresh_process_state: StubBroker) -> None:
    stub = fresh_process_state
    channel = manager.new("jobs-queue")
    assert "jobs-queue" in stub.queues
    assert channel.broker is stub
    job = make_job("jobs-queue", tasks=3)
    job.scheduled()
    messages = queued_messages(stub, "jobs-queue")
    assert len(messages) == 1
    message = messages[0]
    assert message.queue_name == "jobs-queue"
    assert message.actor_name == "pypepper_dramatiq.step"
    assert job.id in message.encode().decode()
    # Ids, not workflows: no task name travels in the message.
    assert b"task-0" not in message.encode()
    asyncio.run(Worker(channel).run_once())
    assert queued_messages(stub, "jobs-queue") == []


def _encoded_size(stub: StubBroker, channel_id: str, job: Job) -> int:
    job.created = job.updated = FIXED_TIME
    job.scheduled()
    (message,) = queued_messages(stub, channel_id)
    return len(message.encode())


def test_message_size_does_not_grow_with_the_number_of_tasks(
    fresh_process_state: StubBroker,
) -> None:
    stub = fresh_process_state
    small = _encoded_size(stub, "chan-a", make_job("chan-a", tasks=1, id="a" * 32))
    large = _encoded_size(stub, "chan-b", make_job("chan-b", tasks=50, id="b" * 32))
    assert large == small


def test_first_message_carries_the_payload_only_with_executor_ids(
    fresh_process_state: StubBroker,
) -> None:
    stub = fresh_process_state
    executor_registry.register("tests.channel.echo", lambda task, context: task.name)

    def durable_job(channel_id: str, tasks: int) -> Job:
        job = Job(category="test", channel_id=channel_id, id=channel_id * 8)
        workflow = Workflow()
        for i in range(tasks):
            workflow.add_task(
                Task(
                    channel_id,
                    "dag",
                    f"fp-{i}",
                    f"durable-{i}",
                    "test",
                    "",
                    [],
                    None,
                    executor_id="tests.channel.echo",
                )
            )
        job.workflows.append(workflow)
        return job

    small = _encoded_size(stub, "ch1", durable_job("ch1", 1))
    large = _encoded_size(stub, "ch2", durable_job("ch2", 5))
    assert large > small
    (message,) = queued_messages(stub, "ch2")
    assert b"tests.channel.echo" in message.encode()


# -- sync vs async scheduling -----------------------------------------------------------------


def test_scheduled_inside_a_running_loop_raises_and_changes_nothing(
    fresh_process_state: StubBroker,
) -> None:
    job = make_job("loop-chan")

    async def go() -> None:
        job.scheduled()

    with pytest.raises(RuntimeError):
        asyncio.run(go())
    assert job.status is Status.UNKNOWN
    assert Job.get_saved(job.id) is None
    channel = manager.get("loop-chan")
    assert channel is None or channel.length() == 0
    queue = fresh_process_state.queues.get("loop-chan")
    assert queue is None or queue.qsize() == 0


def test_async_path_apply_send_save_then_worker_completes() -> None:
    seen: list[str] = []
    job = make_job("async-chan", tasks=2, func=lambda task, context: seen.append(task.name))

    async def go() -> None:
        job.apply_event(INIT)
        job.apply_event(SCHEDULE)
        channel = manager.available("async-chan")
        assert await channel.send(job) == "ok"
        assert job.save()
        saved = Job.get_saved(job.id)
        assert saved is not None and saved.status == "Scheduled"
        processed = await Worker(channel).run_once()
        assert processed is job

    asyncio.run(go())
    assert seen == ["task-0", "task-1"]
    assert job.status is Status.COMPLETED
    saved = Job.get_saved(job.id)
    assert saved is not None and saved.status == "Completed"


def test_async_send_rejections_are_strings_not_errors() -> None:
    channel = manager.new("async-full", maxsize=1)

    async def go() -> list[str]:
        first, second = make_job("async-full"), make_job("async-full")
        for job in (first, second):
            job.apply_event(INIT)
            job.apply_event(SCHEDULE)
        results = [await channel.send(first), await channel.send(second)]
        channel.request_stop()
        results.append(await channel.send(second))
        return results

    assert asyncio.run(go()) == ["ok", "full", "stopped"]


def test_channel_constructed_directly_uses_the_package_broker(
    fresh_process_state: StubBroker,
) -> None:
    channel = Channel("direct")
    assert channel.broker is fresh_process_state
    assert "direct" in fresh_process_state.queues
