"""``pypepper-dramatiq`` writing into a pipe whose reader goes away first (``jobs | head``):
a real subprocess, on the real PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pypepper_dramatiq.cli.commands import PIPE_CLOSED
from pypepper_dramatiq.rules.status import Status
from pypepper_dramatiq.stores.base import JobRecord
from pypepper_dramatiq.stores.sql import SqlJobStore

pytestmark = pytest.mark.postgres

#: The console script installed next to this interpreter.
COMMAND = str(Path(sys.executable).with_name("pypepper-dramatiq"))
#: Jobs enough that their listing (about 1 MB of JSON) is far more than a pipe holds
#: (64 KiB on Linux): the command is still writing when the reader closes its end.
JOBS = 1000


def test_a_reader_that_closes_early_ends_the_command_quietly(
    pg_store: SqlJobStore, postgres_uri: str
) -> None:
    error = "e" * 1000
    records = [JobRecord(id=f"job-{n}", status=Status.FAILED, error=error) for n in range(JOBS)]
    assert all(pg_store.put_many(records))
    argv = [COMMAND, "jobs", "--uri", postgres_uri, "--json", "--limit", str(JOBS)]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as writer:
        assert writer.stdout is not None and writer.stderr is not None
        first = json.loads(writer.stdout.readline())  # the reader takes one line, like head -1
        writer.stdout.close()
        stderr = writer.stderr.read().decode()
        status = writer.wait(timeout=120)
    assert first["id"].startswith("job-")
    assert stderr == ""  # no BrokenPipeError traceback, no "Exception ignored" at exit
    assert status == PIPE_CLOSED == 141
