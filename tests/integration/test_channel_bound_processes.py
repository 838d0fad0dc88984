"""A channel's bound and stop flag hold across producer processes, on either broker.

Two producer processes (``bounded_producer.py``), released together, each schedule 4
jobs on a channel bounded to 5 with no worker taking any: 5 are accepted in all, 3
refused as full. Then this process stops the channel, and a third producer is refused.
On Redis the admission is Redis's; on RabbitMQ it is PostgreSQL's (PostgresTransport).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pika
import pytest

from pypepper_dramatiq import manager

from .conftest import BOTH_BROKERS
from .harness import APP_DIR, Cluster
from .worker_app import ENV

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

MAXSIZE = 5


@pytest.fixture
def channel(cluster: Cluster) -> Iterator[str]:
    """A channel of this test alone (no earlier test's admissions); its RabbitMQ queue,
    if any, deleted afterwards."""
    name = f"bounded-{uuid.uuid4().hex[:8]}"
    yield name
    if cluster.broker_url.startswith("amqp"):
        connection = pika.BlockingConnection(pika.URLParameters(cluster.broker_url))
        try:
            channel = connection.channel()
            for queue in (name, f"{name}.DQ", f"{name}.XQ"):
                channel.queue_delete(queue)
        finally:
            connection.close()


def producers(cluster: Cluster, channel: str, counts: list[int]) -> list[dict[str, Any]]:
    """Run one ``bounded_producer.py`` per count, released together once all are set up."""
    env = {k: v for k, v in os.environ.items() if k not in ENV.values()}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "bounded_producer.py",
                cluster.broker_url,
                cluster.store_uri,
                channel,
                str(MAXSIZE),
                str(count),
            ],
            cwd=APP_DIR,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for count in counts
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # blocks until it is set up
            assert line.strip() == "ready", (line, proc.stderr and proc.stderr.read()[-3000:])
        start_at = repr(time.time() + 0.3)
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(start_at + "\n")
            proc.stdin.flush()
        outputs = []
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err[-3000:]
            outputs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return outputs


@pytest.mark.parametrize("broker_kind", BOTH_BROKERS, indirect=True)
def test_a_bounded_channel_refuses_the_sixth_job_across_two_producers(
    cluster: Cluster, channel: str
) -> None:
    outputs = producers(cluster, channel, [4, 4])

    accepted = [job for out in outputs for job in out["accepted"]]
    refused = [why for out in outputs for why in out["refused"]]
    assert len(accepted) == MAXSIZE, outputs
    assert refused == ["ChannelFullError"] * 3, outputs
    assert manager.available(channel).gate.waiting() == MAXSIZE  # as this process reads it

    manager.available(channel).request_stop()  # from this process: seen by the next one
    [late] = producers(cluster, channel, [1])
    assert late == {"accepted": [], "refused": ["ChannelStoppedError"]}
