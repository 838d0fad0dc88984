"""What a channel on Redis keeps of the jobs its process sends.

A producer whose jobs dramatiq workers run elsewhere never receives them back:
the channel keeps each only while the caller holds it (thousands of jobs sent
must not stay in the producer's memory). A process that takes from the channel
itself (an in-process worker on Redis) gets its own objects back, as on the
in-memory broker.
"""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from pypepper_dramatiq import manager

from .one_task_jobs import one_task_job

pytestmark = pytest.mark.redis

CHANNEL = "sent-jobs"


def test_a_producer_keeps_no_job_it_sent_once_the_caller_dropped_it(broker: object) -> None:
    sent = [one_task_job(CHANNEL) for _ in range(50)]
    for made in sent:
        made.scheduled()
    refs = [weakref.ref(made) for made in sent]
    del sent, made
    gc.collect()
    assert [ref for ref in refs if ref() is not None] == []


def test_a_process_taking_from_the_channel_gets_its_own_jobs_back(broker: object) -> None:
    channel = manager.available(CHANNEL)
    assert channel.take() is None  # this process now takes from the channel
    kept = one_task_job(CHANNEL)
    kept.scheduled()
    dropped_id = one_task_job(CHANNEL).scheduled()
    gc.collect()
    first = asyncio.run(channel.receive())
    second = asyncio.run(channel.receive())
    assert first is kept
    assert second is not None and second.id == dropped_id  # held by the channel meanwhile
