"""Firing a schedule for a channel this worker does not serve, on a real Redis."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
import redis
from process_state import clean_process_state

import pypepper_dramatiq
from pypepper_dramatiq import Context, Job, Task, Workflow, get_job_store, recurring, workflow_task
from pypepper_dramatiq.schedules.firing import fire_due

pytestmark = pytest.mark.redis


@workflow_task(name="recurring-redis.noop")
def noop(task: Task, context: Context) -> None:
    return None


def test_a_worker_fires_for_a_channel_it_does_not_serve_without_consuming_it(
    redis_url: str,
) -> None:
    client = redis.Redis.from_url(redis_url)
    client.delete("dramatiq:elsewhere.msgs", "dramatiq:elsewhere")
    with clean_process_state():
        broker = pypepper_dramatiq.setup(redis_url, channels=["served"])
        template = Job(category="rec", channel_id="elsewhere")
        template.workflows.append(Workflow([noop.task(name="noop")]))
        schedule = recurring("elsewhere", "* * * * *", template)
        store = get_job_store()
        due = datetime.now(timezone.utc).replace(second=0, microsecond=0)
        assert store.advance_recurring(schedule.evolve(next_slot=due))

        [job_id] = fire_due(due + timedelta(seconds=1))

        record = store.get(job_id)
        assert record is not None and record.channel_id == "elsewhere"
        assert "elsewhere" not in broker.get_declared_queues()
        assert client.hlen("dramatiq:elsewhere.msgs") == 1  # its message is on its queue
        broker.close()
    client.close()
