"""A producer process for the cross-process channel bound of ``test_channel_bound_processes``.

Run as ``python bounded_producer.py BROKER_URL STORE_URI CHANNEL MAXSIZE COUNT`` with this
directory as cwd: it calls ``setup()`` with ``CHANNEL`` bounded to ``MAXSIZE``, prints
``ready``, reads a wall-clock time on stdin and sleeps until then (the barrier every
producer shares), then schedules ``COUNT`` jobs on ``CHANNEL``. It prints one JSON line:
``accepted`` (the ids scheduled) and ``refused`` (the name of each error's class).
"""

from __future__ import annotations

import json
import sys
import time

from worker_app import probe  # this directory is the cwd (sys.path[0])

from pypepper_dramatiq import ChannelEnqueueError, Job, Workflow, manager, setup


def main(argv: list[str]) -> None:
    broker_url, store_uri, channel, maxsize, count = argv
    broker = setup(broker_url, store_uri, channels={channel: int(maxsize)})
    manager.available(channel).connect()  # race on admitting, not on connecting
    print("ready", flush=True)
    start_at = float(sys.stdin.readline())
    time.sleep(max(0.0, start_at - time.time()))
    accepted: list[str] = []
    refused: list[str] = []
    for i in range(int(count)):
        job = Job(category="bounded", channel_id=channel)
        job.workflows.append(Workflow([probe.task(name="held", value=i)]))
        try:
            accepted.append(job.scheduled())
        except ChannelEnqueueError as exc:
            refused.append(type(exc).__name__)
    broker.close()
    print(json.dumps({"accepted": accepted, "refused": refused}))


if __name__ == "__main__":
    main(sys.argv[1:])
