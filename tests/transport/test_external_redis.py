"""The suite's Redis tests against a Redis the test session did not start.

This is how tox runs against a Redis container (``PYPEPPER_TEST_REDIS_URL``): here
the container is a ``redis-server`` this test starts itself, handed to a separate
pytest run by the variable alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from conftest import started  # tests/conftest.py
from services import REDIS_URL_VARIABLE, RedisServer

pytestmark = pytest.mark.redis

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture
def outside_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis started by this test, standing for the user's container."""
    server = started(RedisServer(tmp_path / "outside"), "Redis")
    yield server
    server.stop(kill=True)


def _commands_processed(url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return int(client.info("stats")["total_commands_processed"])
    finally:
        client.close()


def test_redis_tests_run_on_the_redis_the_variable_names(
    outside_redis: RedisServer, tmp_path: Path
) -> None:
    before = _commands_processed(outside_redis.url)
    env = dict(os.environ, **{REDIS_URL_VARIABLE: outside_redis.url})
    env.pop("CI", None)  # a skip stays a skip in the inner run
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            "--no-cov",
            f"--basetemp={tmp_path / 'inner'}",
            str(TESTS / "transport" / "test_redis_batch.py"),
            str(TESTS / "driver" / "test_broker_down.py"),
        ],
        cwd=TESTS.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout
    # The tests that restart Redis themselves skip, saying why; the others used it.
    assert f"stops or restarts a Redis of its own; {REDIS_URL_VARIABLE}" in run.stdout
    assert _commands_processed(outside_redis.url) - before > 100
