"""Counts the blocking round trips of a worker process's threads (``BENCH_COUNT_TRIPS=1``).

Each Redis command or pipeline sent, each PostgreSQL statement executed and each
wait for another thread's group-commit batch is one blocking call, counted by
the kind of thread that made it (Dramatiq's worker threads, its consumer
threads, the rest) and where it went (the probe Redis is the task's own). The
counts are written to the probe Redis (hash ``trips:<pid>``) every 0.2 s.
Counting costs CPU: rates are measured without it.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import Any

import psycopg
from dramatiq.worker import WorkerThread, _ConsumerThread
from redis.connection import AbstractConnection

from pypepper_dramatiq.ops import group_commit

from . import probe

_counts: collections.Counter[str] = collections.Counter()
_probe_port = int(os.environ["BENCH_PROBE_URL"].rsplit(":", 1)[1].split("/")[0])


def _thread_kind() -> str:
    thread = threading.current_thread()
    if thread.name == "pypepper-completion":
        return "completion"
    if isinstance(thread, WorkerThread):
        return "worker"
    if isinstance(thread, _ConsumerThread):
        return "consumer"
    return "other"


def install() -> None:
    """Count from now on, and start writing the counts to the probe."""
    send = AbstractConnection.send_packed_command
    execute = psycopg.Cursor.execute
    wait = group_commit._Slot.wait

    def counted_send(self: Any, command: Any, check_health: bool = True) -> None:
        where = "probe" if getattr(self, "port", None) == _probe_port else "redis"
        _counts[f"{_thread_kind()}:{where}"] += 1
        send(self, command, check_health)

    def counted_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        _counts[f"{_thread_kind()}:pg"] += 1
        return execute(self, *args, **kwargs)

    def counted_wait(self: Any) -> None:
        _counts[f"{_thread_kind()}:batch_wait"] += 1
        wait(self)

    AbstractConnection.send_packed_command = counted_send  # type: ignore[method-assign]
    psycopg.Cursor.execute = counted_execute  # type: ignore[method-assign]
    group_commit._Slot.wait = counted_wait  # type: ignore[method-assign]

    def publish() -> None:
        key = f"trips:{os.getpid()}"
        while True:
            time.sleep(0.2)
            counts = dict(_counts)
            if counts:
                probe._client.hset(key, mapping=counts)

    threading.Thread(target=publish, name="bench-trips", daemon=True).start()


def read(client: Any) -> dict[str, int]:
    """The counts of every worker process, summed by kind."""
    total: collections.Counter[str] = collections.Counter()
    for key in client.scan_iter("trips:*"):
        for kind, n in client.hgetall(key).items():
            total[kind.decode()] += int(n)
    return dict(total)
