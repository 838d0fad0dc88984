"""Competitors (how each one sends, runs and finishes a job) and their worker processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import psutil

from .env import ROOT, Stack

#: Threads per worker process, for every competitor.
THREADS = 8

LOGS = ROOT / "bench" / "results" / "logs"

#: Workers started and not yet stopped, so an interrupted run can still stop them.
LIVE: list[Worker] = []


class Worker:
    """Worker processes of one competitor, started in their own session.

    They are SIGKILLed when done: every run starts from empty servers, so a
    graceful shutdown would only add seconds.
    """

    def __init__(self, commands: list[list[str]], name: str) -> None:
        LOGS.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        self.log = open(LOGS / f"{name}.log", "ab")  # noqa: SIM115
        self.procs = [
            subprocess.Popen(
                cmd,
                cwd=ROOT,
                env=env,
                stdout=self.log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            for cmd in commands
        ]
        LIVE.append(self)
        self.peak_rss = 0
        self._sampling = threading.Event()
        self._sampler: threading.Thread | None = None

    def processes(self) -> list[psutil.Process]:
        """The processes that run tasks (a dramatiq CLI's children, or a celery worker)."""
        found: list[psutil.Process] = []
        for proc in self.procs:
            try:
                parent = psutil.Process(proc.pid)
                children = parent.children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            found.extend(children or [parent])
        return found

    def cpu_seconds(self) -> float:
        """The CPU (user + system) the worker processes used so far."""
        total = 0.0
        for proc in self.processes():
            with contextlib.suppress(psutil.NoSuchProcess):
                times = proc.cpu_times()
                total += times.user + times.system
        return total

    def rss(self) -> int:
        """The largest RSS among the worker processes, in bytes."""
        sizes = []
        for proc in self.processes():
            with contextlib.suppress(psutil.NoSuchProcess):
                sizes.append(proc.memory_info().rss)
        return max(sizes, default=0)

    def sample_rss(self, interval: float = 0.2) -> None:
        """Track the peak RSS in the background until :meth:`stop`."""

        def loop() -> None:
            while not self._sampling.wait(interval):
                self.peak_rss = max(self.peak_rss, self.rss())

        self._sampler = threading.Thread(target=loop, daemon=True)
        self._sampler.start()

    def check(self) -> None:
        for proc in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited with {proc.returncode}; see {self.log.name}")

    def stop(self) -> None:
        self._sampling.set()
        if self._sampler is not None:
            self._sampler.join()
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            proc.wait()
        self.log.close()
        if self in LIVE:
            LIVE.remove(self)


def wait_until(predicate: Any, timeout: float, what: str, worker: Worker | None = None) -> float:
    """Poll ``predicate`` every 0.1 s; returns the time waited."""
    start = time.perf_counter()
    while not predicate():
        elapsed = time.perf_counter() - start
        if elapsed > timeout:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        if worker is not None:
            worker.check()
        time.sleep(0.1)
    return time.perf_counter() - start


def wait_for_count(
    count: Any,
    target: int,
    what: str,
    worker: Worker,
    stall: float = 20.0,
    timeout: float = 600,
) -> int:
    """Wait until ``count() >= target``, or until it has not moved for ``stall`` seconds.

    Returns how many are missing (0 when all arrived): jobs the system lost
    are reported, not waited for forever.
    """
    start = moved = time.perf_counter()
    last = count()
    while last < target:
        now = time.perf_counter()
        if now - start > timeout:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        if now - moved > stall:
            return target - last
        worker.check()
        time.sleep(0.1)
        current = count()
        if current != last:
            last, moved = current, time.perf_counter()
    return 0


@dataclass
class Competitor:
    """One way of running a no-op job: send it, run it, see it finished."""

    stack: Stack
    name: str = ""
    tag: str = ""
    label: str = ""
    sent: dict[str, float] = field(default_factory=dict)

    def worker(self, processes: int) -> Worker:
        raise NotImplementedError

    def send(self, key: str | None = None, tasks: int = 1) -> str:
        raise NotImplementedError

    def done(self) -> int:
        raise NotImplementedError

    def last_done(self) -> float:
        raise NotImplementedError

    def done_times(self) -> dict[str, float]:
        raise NotImplementedError

    def first_start(self) -> float:
        return float(self.stack.probe.get(f"{self.tag}:first") or 0)

    def start_times(self) -> dict[str, float]:
        raw = self.stack.probe.hgetall(f"{self.tag}:start")
        return {k.decode(): float(v) for k, v in raw.items()}

    def warm(self) -> None:
        """Open the producer's connections (the run that follows wipes what was sent)."""
        for _ in range(3):
            self.send()


def _dramatiq_cmd(module: str, processes: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dramatiq",
        module,
        "--path",
        str(ROOT),
        "--processes",
        str(processes),
        "--threads",
        str(THREADS),
    ]


class Plain(Competitor):
    def __init__(self, stack: Stack) -> None:
        super().__init__(stack, "plain", "plain", "plain Dramatiq")
        from .apps import plain

        self.actor = plain.noop

    def worker(self, processes: int) -> Worker:
        return Worker([_dramatiq_cmd("bench.apps.plain", processes)], self.name)

    def send(self, key: str | None = None, tasks: int = 1) -> str:
        self.actor.send(key)
        return key or ""

    def done(self) -> int:
        return int(self.stack.probe.get("plain:n") or 0)

    def last_done(self) -> float:
        return float(self.stack.probe.get("plain:last") or 0)

    def done_times(self) -> dict[str, float]:
        # Nothing outlives the actor's return: its start is its end (to within the no-op).
        return self.start_times()


class Durable(Competitor):
    def __init__(self, stack: Stack) -> None:
        super().__init__(stack, "durable", "durable", "durable job (pypepper)")
        from .apps import durable

        self.app = durable

    def worker(self, processes: int) -> Worker:
        return Worker([_dramatiq_cmd("bench.apps.durable", processes)], self.name)

    def workers_apart(self, count: int, name: str) -> Worker:
        """``count`` separate ``dramatiq bench.apps.durable --processes 1`` commands."""
        return Worker([_dramatiq_cmd("bench.apps.durable", 1) for _ in range(count)], name)

    def brokers_seen(self) -> int:
        """Broker processes (other than this one) that fetched from Redis lately:
        the members of Dramatiq's heartbeat set, which each worker process joins."""
        ours = str(getattr(self.app.broker, "broker_id", ""))
        members: Any = self.stack.broker.zrange("dramatiq:__heartbeats__", 0, -1)
        return sum(1 for m in members if m.decode() != ours)

    def send(self, key: str | None = None, tasks: int = 1) -> str:
        job = self.app.job(tasks, key)
        job.scheduled()
        return job.id

    def send_many(self, count: int, tasks: int = 1) -> list[str]:
        """Schedule ``count`` jobs with one ``schedule_many`` call; their ids."""
        from pypepper_dramatiq import schedule_many

        results = schedule_many([self.app.job(tasks) for _ in range(count)])
        assert all(isinstance(r, str) for r in results), results
        return [str(r) for r in results]

    def done(self) -> int:
        # Only the no-op jobs: the retry storm's jobs (category "storm") finish meanwhile.
        return int(
            self.stack.scalar(
                "SELECT count(*) FROM scheduler_jobs "
                "WHERE category = 'bench' AND status = 'Completed'"
            )
        )

    def terminal(self, category: str) -> int:
        return int(
            self.stack.scalar(
                "SELECT count(*) FROM scheduler_jobs "
                "WHERE category = %s AND status IN ('Completed', 'Failed', 'Cancelled')",
                category,
            )
        )

    def last_done(self) -> float:
        return float(
            self.stack.scalar(
                "SELECT extract(epoch FROM max(updated)) FROM scheduler_jobs "
                "WHERE status = 'Completed'"
            )
            or 0
        )

    def done_times(self) -> dict[str, float]:
        rows = self.stack.sql(
            "SELECT payload #>> '{workflows,0,tasks,0,params,key}', extract(epoch FROM updated) "
            "FROM scheduler_jobs WHERE status = 'Completed'"
        )
        return {key: float(at) for key, at in rows if key}


class CeleryCompetitor(Competitor):
    def __init__(self, stack: Stack) -> None:
        super().__init__(stack, "celery", "celery", "Celery (threads)")
        from .apps import celery_app

        self.task = celery_app.noop
        # Create celery_taskmeta now, so no worker pays for it inside a measurement.
        celery_app.app.backend.ResultSession().close()

    def worker(self, processes: int) -> Worker:
        commands = [
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "bench.apps.celery_app",
                "worker",
                "--pool",
                "threads",
                "--concurrency",
                str(THREADS),
                "-Q",
                "celery",
                "-n",
                f"w{i}-{uuid.uuid4().hex[:6]}@%h",
                "--loglevel",
                "WARNING",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ]
            for i in range(processes)
        ]
        return Worker(commands, self.name)

    def send(self, key: str | None = None, tasks: int = 1) -> str:
        self.task.apply_async(kwargs={"key": key}, task_id=key)
        return key or ""

    def done(self) -> int:
        return int(
            self.stack.scalar("SELECT count(*) FROM celery_taskmeta WHERE status = 'SUCCESS'")
        )

    def last_done(self) -> float:
        return float(
            self.stack.scalar(
                "SELECT extract(epoch FROM max(date_done) "
                "AT TIME ZONE current_setting('TimeZone')) "
                "FROM celery_taskmeta WHERE status = 'SUCCESS'"
            )
            or 0
        )

    def done_times(self) -> dict[str, float]:
        rows = self.stack.sql(
            "SELECT task_id, extract(epoch FROM date_done AT TIME ZONE "
            "current_setting('TimeZone')) FROM celery_taskmeta WHERE status = 'SUCCESS'"
        )
        return {key: float(at) for key, at in rows}


class PlainRabbitmq(Plain):
    """Plain Dramatiq on RabbitMQ (``bench.apps.plain_rabbitmq``)."""

    def __init__(self, stack: Stack) -> None:
        Competitor.__init__(self, stack, "plain", "plain_rmq", "plain Dramatiq on RabbitMQ")
        from .apps import plain_rabbitmq

        self.actor = plain_rabbitmq.noop

    def worker(self, processes: int) -> Worker:
        return Worker([_dramatiq_cmd("bench.apps.plain_rabbitmq", processes)], self.name)

    def done(self) -> int:
        return int(self.stack.probe.get("plain_rmq:n") or 0)

    def last_done(self) -> float:
        return float(self.stack.probe.get("plain_rmq:last") or 0)


class DurableParams(Durable):
    """Durable one-task jobs whose task takes a dataclass, a datetime and a Decimal
    (``typed``), or the same values as plain JSON (scenario 16)."""

    def __init__(self, stack: Stack, typed: bool) -> None:
        super().__init__(stack)
        self.typed = typed
        self.label = "durable job, typed parameters" if typed else "durable job, JSON parameters"

    def send(self, key: str | None = None, tasks: int = 1) -> str:
        job = self.app.params_job(self.typed)
        job.scheduled()
        return job.id


class DurableRabbitmq(Durable):
    """Durable jobs on RabbitMQ: the workers' ``BENCH_BROKER_URL`` names it, and this
    process's ``setup()`` switches to it for the scenario (:meth:`use`)."""

    def __init__(self, stack: Stack) -> None:
        super().__init__(stack)
        self.label = "durable job on RabbitMQ"

    def use(self, broker_url: str) -> None:
        """``setup()`` this process on ``broker_url`` (and the benchmark's store)."""
        from pypepper_dramatiq import setup

        setup(broker_url, os.environ["BENCH_STORE_URI"], channels=[self.app.CHANNEL])


COMPETITORS = {"plain": Plain, "durable": Durable, "celery": CeleryCompetitor}
