"""Dramatiq's own RabbitMQ tests, run against our RabbitMQ node with our middleware
installed on their broker: plain actors must not notice us.

The tests come from the source distribution of the Dramatiq version installed here,
downloaded from PyPI when the test runs (nothing of it is kept in this repository).
That distribution leaves out the two helper modules its tests import (their fixtures
and constants); the test writes small ones of its own in their place: a broker on this
session's node with ``max_priority=10``, wired by our ``setup(broker=...)``, and a
worker of Dramatiq's own on it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path
from urllib.parse import unquote, urlsplit

import dramatiq
import pytest
from conftest import unavailable  # tests/conftest.py
from services import RabbitMQServer

pytestmark = pytest.mark.rabbitmq

#: The file of Dramatiq's source distribution that tests its RabbitMQ broker.
SUITE = "tests/test_rabbitmq.py"

#: Tests of that file left out, each building a broker of its own on RabbitMQ's default
#: address (127.0.0.1:5672, where nothing of ours listens) to test pika's connection
#: parameters; they do not use the fixture broker, so our middleware is not on them.
OWN_BROKERS = (
    "test_rabbitmq_broker_can_be_passed_a_semicolon_separated_list_of_uris",
    "test_rabbitmq_broker_can_be_passed_a_list_of_uri_for_failover",
    "test_rabbitmq_broker_can_be_passed_a_list_of_parameters_for_failover",
    "test_rabbitmq_broker_connections_are_lazy",
)

#: What the suite imports from its ``common`` module.
COMMON = '''\
"""Stands in for the helper module Dramatiq's repository has and its sdist lacks."""

import os

import pika

RABBITMQ_USERNAME = os.environ["PYPEPPER_SUITE_RABBITMQ_USER"]
RABBITMQ_PASSWORD = os.environ["PYPEPPER_SUITE_RABBITMQ_PASSWORD"]
RABBITMQ_CREDENTIALS = pika.credentials.PlainCredentials(RABBITMQ_USERNAME, RABBITMQ_PASSWORD)


def skip_unless_rabbit_mq(test):
    return test  # the node runs: the outer test started it
'''

#: The suite's fixtures: Dramatiq's broker on our node, wired by pypepper's setup().
CONFTEST = '''\
"""The fixtures the suite asks for, with pypepper's middleware on the broker."""

import os

import dramatiq
import pytest
from dramatiq import Worker
from dramatiq.brokers.rabbitmq import RabbitmqBroker

from pypepper_dramatiq import setup
from pypepper_dramatiq.drivers.dramatiq.middleware import WorkflowMiddleware


@pytest.fixture()
def rabbitmq_broker():
    broker = RabbitmqBroker(url=os.environ["PYPEPPER_SUITE_RABBITMQ_URL"], max_priority=10)
    assert setup(broker=broker) is broker
    assert sum(isinstance(m, WorkflowMiddleware) for m in broker.middleware) == 1
    broker.emit_after("process_boot")
    dramatiq.set_broker(broker)
    yield broker
    broker.flush_all()
    broker.close()


@pytest.fixture()
def rabbitmq_worker(rabbitmq_broker):
    worker = Worker(rabbitmq_broker, worker_timeout=100)
    worker.start()
    yield worker
    worker.stop()
'''


@pytest.fixture(scope="module")
def dramatiq_suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the installed Dramatiq's RabbitMQ tests as a package of their own."""
    where = tmp_path_factory.mktemp("dramatiq-suite")
    version = dramatiq.__version__
    pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
    download = subprocess.run(
        [*pip, f"dramatiq=={version}", "-d", str(where)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    archives = list(where.glob(f"dramatiq-{version}.tar.gz"))
    if download.returncode != 0 or not archives:
        unavailable(
            f"Dramatiq {version}'s source distribution could not be downloaded: "
            f"{download.stderr.strip()[-500:]}"
        )
    with tarfile.open(archives[0]) as archive:
        member = archive.extractfile(f"dramatiq-{version}/{SUITE}")
        assert member is not None, f"no {SUITE} in Dramatiq {version}'s sdist"
        tests = member.read()
    package = where / "dramatiq_suite"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "common.py").write_text(COMMON)
    (package / "conftest.py").write_text(CONFTEST)
    (package / "test_rabbitmq.py").write_bytes(tests)
    (where / "pytest.ini").write_text("[pytest]\n")
    return where


@pytest.mark.timeout(600)
def test_dramatiqs_own_rabbitmq_tests_pass_with_our_middleware(
    dramatiq_suite: Path, own_rabbitmq: RabbitMQServer
) -> None:
    # A node of its own: Dramatiq's fixture declares its queues with max_priority=10, which
    # RabbitMQ refuses for a queue another test declared already without it.
    rabbitmq_url = own_rabbitmq.url
    address = urlsplit(rabbitmq_url)
    env = dict(
        os.environ,
        PYPEPPER_SUITE_RABBITMQ_URL=rabbitmq_url,
        PYPEPPER_SUITE_RABBITMQ_USER=unquote(address.username or "guest"),
        PYPEPPER_SUITE_RABBITMQ_PASSWORD=unquote(address.password or "guest"),
    )
    deselected = [f"--deselect=dramatiq_suite/test_rabbitmq.py::{name}" for name in OWN_BROKERS]
    pytest_in_suite = [sys.executable, "-m", "pytest", "-q", "-o", "cache_dir=.cache"]
    options = ["-c", "pytest.ini", "--rootdir", ".", "-o", "addopts="]

    def suite(*more: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*pytest_in_suite, *options, *deselected, *more, "dramatiq_suite/test_rabbitmq.py"],
            cwd=dramatiq_suite,
            env=env,
            capture_output=True,
            text=True,
            timeout=540,
        )

    run = suite()
    first = textwrap.indent((run.stdout + run.stderr)[-6000:], "  ")
    passed = re.search(r"(\d+) passed", run.stdout)
    assert passed is not None, first
    # Every test of the file but those left out ran: none skipped for want of a fixture
    # or of the node.
    collected = (dramatiq_suite / "dramatiq_suite" / "test_rabbitmq.py").read_text()
    written = len(re.findall(r"^def test_", collected, re.MULTILINE))
    failed = re.search(r"(\d+) failed", run.stdout)
    ran = int(passed.group(1)) + (int(failed.group(1)) if failed else 0)
    assert ran == written - len(OWN_BROKERS), first
    assert "skipped" not in run.stdout.splitlines()[-1], first
    if run.returncode != 0:
        # Some of Dramatiq's tests time what a worker does (a delay, a backoff); on a
        # loaded machine one may miss by a little. What failed must pass when run again:
        # a difference our middleware makes fails every time.
        again = suite("--last-failed")
        print(f"run again after a first failure:\n{first}")
        assert again.returncode == 0, (
            f"Dramatiq's RabbitMQ tests failed twice with our middleware:\n{first}\n"
            + textwrap.indent((again.stdout + again.stderr)[-6000:], "  ")
        )
