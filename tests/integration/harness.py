"""Driving real ``dramatiq`` worker processes and reading what they left behind.

:class:`WorkerProcess` runs the stock CLI on ``worker_app`` in its own process
group (so a crash kills the master and its children at once);
:class:`Cluster` is the test process's side: it calls ``setup()`` on the same
Redis and PostgreSQL, schedules jobs, and reads outcomes from the job store
and the probes' traces from Redis. Every wait is a bounded poll.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

import redis
from dramatiq.broker import Broker
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from sqlalchemy import create_engine, text

from pypepper_dramatiq import Job, Status, Task, Workflow, manager, reset_job_store, setup
from pypepper_dramatiq.channels import broker as broker_module
from pypepper_dramatiq.errors import StoreError
from pypepper_dramatiq.stores.base import JobRecord

from . import worker_app
from .worker_app import CHANNEL, ENV, trace_key

#: Where ``worker_app`` lives: the workers' cwd and PYTHONPATH.
APP_DIR = Path(worker_app.__file__).resolve().parent
#: The stock CLI of the venv running the tests.
DRAMATIQ = str(Path(sys.executable).with_name("dramatiq"))
#: What a worker process logs once its threads run.
READY_LINE = "Worker process is ready for action."


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` s.

    A :class:`StoreError` while polling counts as "not yet" (servers restart in some tests).
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except StoreError:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


class WorkerProcess:
    """``dramatiq worker_app --processes P --threads T`` in a new session.

    Args:
        log_path: the CLI's stdout and stderr go there (read it when a test fails).
        env: the ``PYPEPPER_IT_*`` settings (see ``worker_app.ENV``).
    """

    def __init__(
        self, log_path: Path, env: dict[str, str], processes: int = 1, threads: int = 2
    ) -> None:
        self.log_path = log_path
        self.processes = processes
        self._log: IO[bytes] = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        full_env = dict(os.environ, PYTHONPATH=str(APP_DIR), PYTHONUNBUFFERED="1", **env)
        self.proc = subprocess.Popen(
            [DRAMATIQ, "worker_app", "--processes", str(processes), "--threads", str(threads)],
            cwd=APP_DIR,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def group_pids(self) -> set[int]:
        """Pids of the live processes in this CLI's process group (Linux ``/proc``)."""
        pids = set()
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue  # the process just went away
            if int(fields[2]) == self.pid:  # fields after "comm": state, ppid, pgrp
                pids.add(int(stat.parent.name))
        return pids

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 45) -> None:
        """Wait until every worker process of this CLI has started its threads."""

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited {self.proc.returncode}:\n{self.log()[-3000:]}")
            return self.log().count(READY_LINE) >= self.processes

        wait_for(ready, timeout, f"worker {self.pid} to boot")

    def kill(self) -> None:
        """SIGKILL the whole process group: the CLI master and its worker processes."""
        if self.proc.poll() is None or self._group_alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        wait_for(lambda: not self._group_alive(), 30, f"process group {self.pid} to die")

    def terminate(self) -> None:
        """SIGTERM the CLI master, which forwards it to its worker processes (a graceful stop)."""
        self.proc.send_signal(signal.SIGTERM)

    def stop_gracefully(self, timeout: float = 30) -> float:
        """SIGTERM, then wait for the exit; returns the seconds it took."""
        signalled_at = time.monotonic()
        self.terminate()
        self.wait_exit(timeout=timeout)
        return time.monotonic() - signalled_at

    def wait_exit(self, timeout: float) -> int:
        wait_for(lambda: self.proc.poll() is not None, timeout, f"worker {self.pid} to exit")
        return self.proc.returncode

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # pragma: no cover - a recycled group id
            return False
        return True

    def stop(self) -> None:
        """Kill what is left and release the log file (teardown)."""
        try:
            self.kill()
        finally:
            self._log.close()


class Cluster:
    """The test process wired to one broker and one job store, as a user's scheduler would be.

    Args:
        redis_url, store_uri: the servers the workers use too; Redis holds the probes'
            traces, and is the broker unless ``broker_url`` names another.
        tmp_path: where worker logs go.
        broker_url: the broker (``amqp://``: RabbitMQ, its test queue emptied first);
            None: ``redis_url``.
        max_priority: RabbitMQ only: the broker is built with Dramatiq's
            ``max_priority`` (its queues declared with ``x-max-priority``), here and in
            the workers; RabbitMQ refuses to change an existing queue's arguments, so
            such a cluster serves ``channel`` (one no other test declares).
        channel: the channel this process declares (the workers': ``extra_env``).
    """

    def __init__(
        self,
        redis_url: str,
        store_uri: str,
        tmp_path: Path,
        broker_url: str | None = None,
        *,
        max_priority: int | None = None,
        channel: str = CHANNEL,
    ) -> None:
        self.redis_url = redis_url
        self.broker_url = broker_url or redis_url
        self.store_uri = store_uri
        self.tmp_path = tmp_path
        self.workers: list[WorkerProcess] = []
        self.max_priority = max_priority
        if max_priority is None:
            self.broker: Broker = setup(
                self.broker_url, store_uri, channels={channel: 0}, migrate=True
            )
        else:
            made = RabbitmqBroker(
                url=self.broker_url, confirm_delivery=True, max_priority=max_priority
            )
            self.broker = setup(
                broker=made, store_uri=store_uri, channels={channel: 0}, migrate=True
            )
        if isinstance(self.broker, RabbitmqBroker):
            self.broker.flush_all()  # what an earlier test left queued
        self.redis = redis.Redis.from_url(redis_url)

    def close(self) -> None:
        errors = []
        for worker in self.workers:
            try:
                worker.stop()
            except Exception as exc:  # keep killing the others
                errors.append(exc)
        self.redis.close()
        self.broker.close()
        manager.clear()
        reset_job_store()
        broker_module.set_broker(None)
        if errors:
            raise errors[0]

    # -- workers

    def start_worker(
        self,
        *,
        processes: int = 1,
        threads: int = 2,
        lease_seconds: float = 5,
        sweep_interval: float = 0.5,
        cancel_grace: float = 1,
        dispatch_seconds: float | None = None,
        heartbeat_timeout_ms: int = 20_000,
        shutdown_grace: float = 0,
        unknown_task_grace: float = 300,
        upgraded: bool = False,
        debug_steps: bool = False,
        defer_seconds: float = 2,
        store_uri: str | None = None,
        wait: bool = True,
        retention: dict[str, Any] | None = None,
        metrics: bool = False,
        extra_env: dict[str, str] | None = None,
    ) -> WorkerProcess:
        env = {
            ENV["defer_seconds"]: str(defer_seconds),
            ENV["debug_steps"]: "1" if debug_steps else "0",
            ENV["shutdown_grace"]: str(shutdown_grace),
            ENV["unknown_task_grace"]: str(unknown_task_grace),
            ENV["upgraded"]: "1" if upgraded else "0",
            ENV["heartbeat_timeout_ms"]: str(heartbeat_timeout_ms),
            ENV["redis_url"]: self.redis_url,
            ENV["broker_url"]: self.broker_url,
            ENV["store_uri"]: store_uri or self.store_uri,
            ENV["lease_seconds"]: str(lease_seconds),
            ENV["sweep_interval"]: str(sweep_interval),
            ENV["cancel_grace"]: str(cancel_grace),
        }
        if self.max_priority is not None:
            env[ENV["max_priority"]] = str(self.max_priority)
        if dispatch_seconds is not None:
            env[ENV["dispatch_seconds"]] = str(dispatch_seconds)
        if retention is not None:
            env[ENV["retention"]] = json.dumps(retention)
        if metrics:
            env[ENV["metrics"]] = "1"
        env.update(extra_env or {})
        log = self.tmp_path / f"worker-{len(self.workers)}.log"
        worker = WorkerProcess(log, env, processes=processes, threads=threads)
        self.workers.append(worker)
        if wait:
            worker.wait_ready()
        return worker

    def logs(self) -> str:
        """Every worker's log, for failure messages."""
        return "\n".join(f"== {w.log_path.name}\n{w.log()[-4000:]}" for w in self.workers)

    # -- jobs

    def schedule(self, *tasks: Task) -> Job:
        """A one-workflow job of ``tasks`` on the test channel, scheduled."""
        job = Job(category="it", channel_id=CHANNEL)
        job.workflows.append(Workflow(tasks))
        job.scheduled()
        return job

    def schedule_in(self, delay: float, *tasks: Task) -> Job:
        """:meth:`schedule`, the job to start ``delay`` seconds from now."""
        job = Job(category="it", channel_id=CHANNEL)
        job.workflows.append(Workflow(tasks))
        job.scheduled(delay=delay)
        return job

    def saved(self, job: Job | str) -> JobRecord:
        record = Job.get_saved(job if isinstance(job, str) else job.id)
        assert record is not None, f"job {job} is not in the store"
        return record

    def wait_status(
        self,
        jobs: Iterable[Job],
        timeout: float,
        statuses: Iterable[Status] = (Status.COMPLETED,),
    ) -> dict[str, JobRecord]:
        """Wait until every job is terminal; assert each ended in ``statuses``."""
        ids = [job.id for job in jobs]
        wanted = set(statuses)
        records: dict[str, JobRecord] = {}

        def all_terminal() -> bool:
            for job_id in ids:
                if job_id in records and records[job_id].status.is_terminal:
                    continue
                record = Job.get_saved(job_id)
                if record is None or not record.status.is_terminal:
                    return False
                records[job_id] = record
            return True

        try:
            wait_for(all_terminal, timeout, f"{len(ids)} jobs to end", interval=0.2)
        except AssertionError as exc:
            pending = {i: Job.get_saved(i) for i in ids if i not in records}
            summary = {
                i: (r.status.value, r.state.get("cursor")) if r else None
                for i, r in pending.items()
            }
            raise AssertionError(f"{exc}; still pending: {summary}\n{self.logs()}") from None
        wrong = {i: (r.status.value, r.error) for i, r in records.items() if r.status not in wanted}
        assert not wrong, f"jobs ended outside {sorted(s.value for s in wanted)}: {wrong}"
        return records

    # -- traces left by worker_app.probe

    def runs(self, job: Job, name: str) -> int:
        return int(self.redis.get(trace_key("runs", job.id, name)) or 0)

    def times(self, kind: str, job: Job, name: str) -> list[float]:
        return [float(v) for v in self.redis.lrange(trace_key(kind, job.id, name), 0, -1)]

    def run_pids(self, job: Job, name: str) -> list[int]:
        """The pid of the worker process of each execution, in order."""
        return [int(v) for v in self.redis.lrange(trace_key("pids", job.id, name), 0, -1)]

    def stamp(self, kind: str, job: Job, name: str) -> float | None:
        """The time in a ``kind:J:N`` string key (``running``, ``cancel_seen``...), or None."""
        value = self.redis.get(trace_key(kind, job.id, name))
        return None if value is None else float(value.split()[0])


def raw(uri: str, sql: str, **params: Any) -> Any:
    """Run one SQL statement on the database at ``uri`` as a person would in psql
    (a row changed by hand); its rows, or how many it changed."""
    engine = create_engine(uri)
    try:
        with engine.begin() as conn:
            result = conn.execute(text(sql), params)
            return result.all() if result.returns_rows else result.rowcount
    finally:
        engine.dispose()
