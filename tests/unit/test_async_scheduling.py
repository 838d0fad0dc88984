"""``await job.scheduled_async()``: scheduling from async code (``examples/fastapi_app.py``).

The example's endpoint functions are plain ``async def`` functions; the tests
call them inside ``asyncio.run`` without FastAPI installed.
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from dramatiq.brokers.stub import StubBroker
from process_state import clean_process_state

from pypepper_dramatiq import (
    CallableExecutor,
    ChannelFullError,
    ChannelStoppedError,
    InvalidTransitionError,
    Job,
    Status,
    StoreNotConfiguredError,
    Task,
    Worker,
    Workflow,
    config,
    manager,
    set_job_store,
)
from pypepper_dramatiq.stores.base import JobRecord
from pypepper_dramatiq.stores.memory import MemoryJobStore

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fastapi_app.py"


@pytest.fixture(autouse=True)
def fresh_process_state() -> Iterator[None]:
    """A new stub broker, no channels, no config, the default store; none left after."""
    stub = StubBroker()
    with clean_process_state(stub):
        yield
    stub.close()


@pytest.fixture
def example() -> ModuleType:
    """``examples/fastapi_app.py``, loaded afresh (its task is registered for this test)."""
    spec = importlib.util.spec_from_file_location("fastapi_app_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def plain_job(channel_id: str = "plain") -> Job:
    job = Job(category="async", channel_id=channel_id)
    task = Task(channel_id, "dag", "fp", "t", None, "", [], CallableExecutor(lambda t, c: "ran"))
    job.workflows.append(Workflow([task]))
    return job


def test_the_example_schedules_from_a_running_loop_and_the_job_runs(example: ModuleType) -> None:
    example.configure()

    async def scenario() -> tuple[dict[str, Any], Any, Any]:
        asyncio.get_running_loop()  # we are inside an event loop
        created = await example.create_greeting("ada")
        stored = Job.get_saved(created["job_id"])
        job = await Worker(manager.available(example.CHANNEL)).run_once()
        return created, stored, job

    created, stored, job = asyncio.run(scenario())

    assert created["status"] == "Scheduled"
    assert stored is not None and stored.status is Status.SCHEDULED
    assert job is not None and job.id == created["job_id"]
    assert job.context.results == {"greet": "hello ada"}
    assert asyncio.run(example.greeting_status(job.id))["status"] == "Completed"


def test_scheduled_still_refuses_a_running_loop() -> None:
    """The seed's rule is kept: the sync call raises RuntimeError inside a loop."""
    manager.new("plain")
    job = plain_job()

    async def scenario() -> None:
        job.scheduled()

    with pytest.raises(RuntimeError, match="sync code"):
        asyncio.run(scenario())
    assert job.status is Status.UNKNOWN


def test_a_full_channel_raises_through_await(example: ModuleType) -> None:
    example.configure(maxsize=1)

    async def scenario() -> None:
        await example.create_greeting("first")
        await example.create_greeting("second")

    with pytest.raises(ChannelFullError):
        asyncio.run(scenario())
    assert manager.available(example.CHANNEL).length() == 1


def test_a_refused_job_is_rolled_back_and_may_be_scheduled_again() -> None:
    channel = manager.new("plain", maxsize=1)
    blocker, job = plain_job(), plain_job()
    blocker.scheduled()

    with pytest.raises(ChannelFullError):
        asyncio.run(job.scheduled_async())
    assert job.status is Status.UNKNOWN
    assert Job.get_saved(job.id) is None

    assert channel.take() is not None  # room again
    asyncio.run(job.scheduled_async())
    record = Job.get_saved(job.id)
    assert record is not None and record.status is Status.SCHEDULED


def test_other_errors_of_scheduled_propagate_unchanged(tmp_path: Path) -> None:
    channel = manager.new("plain")
    job = plain_job()
    asyncio.run(job.scheduled_async())
    with pytest.raises(InvalidTransitionError):
        asyncio.run(job.scheduled_async())  # already Scheduled

    channel.request_stop()
    with pytest.raises(ChannelStoppedError):
        asyncio.run(plain_job().scheduled_async())

    yaml = tmp_path / "app.yaml"
    yaml.write_text("scheduler:\n  jobStore:\n    backend: postgres\n    uri: postgresql://x/y\n")
    config.load_config(str(yaml))
    manager.new("other")
    with pytest.raises(StoreNotConfiguredError):
        asyncio.run(plain_job("other").scheduled_async())


def test_arguments_are_passed_on_to_scheduled() -> None:
    """Options reach ``scheduled()`` as given: a bad one is refused there, alike."""
    manager.new("plain")
    job = plain_job()
    with pytest.raises(TypeError) as sync_error:
        job.scheduled(priority="1")  # type: ignore[arg-type]
    with pytest.raises(TypeError) as async_error:
        asyncio.run(job.scheduled_async(priority="1"))
    assert str(async_error.value) == str(sync_error.value)
    assert job.status is Status.UNKNOWN


class SlowStore(MemoryJobStore):
    """A memory store whose writes take ``delay`` seconds (a slow database)."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay
        self.put_threads: list[str] = []

    def put(self, record: JobRecord) -> bool:
        self.put_threads.append(threading.current_thread().name)
        time.sleep(self.delay)
        return super().put(record)


def test_the_event_loop_keeps_running_while_the_store_writes(example: ModuleType) -> None:
    store = SlowStore(delay=0.5)
    set_job_store(store)
    example.configure()

    async def scenario() -> tuple[int, float]:
        ticks = 0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop.is_set():
                await asyncio.sleep(0.01)
                ticks += 1

        ticking = asyncio.create_task(ticker())
        began = time.monotonic()
        await example.create_greeting("ada")
        took = time.monotonic() - began
        stop.set()
        await ticking
        return ticks, took

    ticks, took = asyncio.run(scenario())

    assert took >= 0.5
    assert ticks >= 20  # ~50 in 0.5 s; a blocked loop would tick once or twice
    assert store.put_threads and threading.main_thread().name not in store.put_threads
