"""The distributed quick starts of the README, the tutorial and the distributed page, run
as written.

Their blocks name ``redis://localhost:6379/0`` and a PostgreSQL database ``jobs``: this
test takes each page's ``tasks.py`` block as Sybil reads it, points those two
addresses at the test servers (nothing else is changed), migrates a new database with
the CLI, starts two stock ``dramatiq tasks`` workers, and submits as the page says.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sybil import Sybil
from sybil.parsers.myst import PythonCodeBlockParser, SkipParser

from pypepper_dramatiq.stores.sql import SqlJobStore

from .conftest import flush_redis
from .harness import DRAMATIQ, READY_LINE, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("pypepper-dramatiq"))
PAGE_REDIS = "redis://localhost:6379/0"
PAGE_STORE = "postgresql+psycopg://user:pass@localhost/jobs"


def python_blocks(page: Path) -> list[str]:
    """The source of each ``python`` block of ``page`` (skipped ones included)."""
    reader = Sybil(parsers=[PythonCodeBlockParser(), SkipParser()])
    return [
        str(example.parsed)
        for example in reader.parse(page)
        if not isinstance(example.parsed, tuple)
    ]


def tasks_module(page: Path) -> str:
    found = [block for block in python_blocks(page) if block.lstrip().startswith("# tasks.py")]
    assert len(found) == 1, f"{page.name} should have one tasks.py block"
    assert PAGE_REDIS in found[0] and PAGE_STORE in found[0]
    return found[0]


def producer_block(page: Path) -> str:
    found = [block for block in python_blocks(page) if "import tasks\n" in block]
    assert len(found) == 1, f"{page.name} should have one block that imports tasks"
    return found[0]


def start_worker(app: Path, env: dict[str, str], name: str) -> subprocess.Popen[bytes]:
    with (app / f"{name}.log").open("wb") as log:  # the worker keeps its own copy of the fd
        return subprocess.Popen(
            [DRAMATIQ, "tasks", "--processes", "1", "--threads", "8"],
            cwd=app,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@pytest.mark.parametrize("page", ["README.md", "docs/tutorial.md", "docs/howto/distributed.md"])
def test_the_page_s_quick_start_runs_on_two_workers(
    page: str, redis_url: str, empty_postgres_uri: str, tmp_path: Path
) -> None:
    flush_redis(redis_url)
    source = tasks_module(ROOT / page)
    (tmp_path / "tasks.py").write_text(
        source.replace(PAGE_REDIS, redis_url).replace(PAGE_STORE, empty_postgres_uri),
        encoding="utf-8",
    )
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    subprocess.run([CLI, "migrate", "--uri", empty_postgres_uri], env=env, check=True, timeout=60)
    workers = [start_worker(tmp_path, env, f"worker-{n}") for n in (1, 2)]
    store = SqlJobStore(empty_postgres_uri)
    try:
        for n in (1, 2):
            wait_for(
                lambda n=n: READY_LINE in (tmp_path / f"worker-{n}.log").read_text(),
                60,
                f"worker {n} to start",
            )
        submitted = subprocess.run(
            [sys.executable, "-c", "import tasks; print(tasks.submit('https://example.com'))"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout.split()
        assert len(submitted) == 1
        record = wait_for(
            lambda: (r := store.get(submitted[0])) is not None and r.status.is_terminal and r,
            60,
            "the submitted job to end",
        )
        assert record.status.value == "Completed", record.error
        assert record.result("fetch") == {"url": "https://example.com"}
        listed = subprocess.run(
            [CLI, "jobs", "--uri", empty_postgres_uri],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert submitted[0] in listed
    finally:
        store.close()
        for worker in workers:
            os.killpg(worker.pid, 9)
            worker.wait(timeout=30)
