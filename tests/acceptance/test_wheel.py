"""The built wheel, installed into a fresh venv, does what the README says.

As a user gets it: ``pip wheel`` builds the package, a new venv installs it (with the
dashboard extra) from that wheel and PyPI, and everything below runs from a folder
outside this checkout, so that nothing imports the source tree: the README's demo, its
distributed quick start on two stock ``dramatiq`` workers, the CLI, and the dashboard
as a process of its own that knows the task code only through ``--import``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from integration.conftest import flush_redis
from integration.harness import READY_LINE, wait_for
from integration.test_docs_quickstart import PAGE_REDIS, PAGE_STORE, python_blocks, tasks_module

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


@pytest.fixture(scope="module")
def venv_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin folder of a new venv holding the wheel built from this checkout."""
    where = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(where), str(ROOT)],
        check=True,
        timeout=600,
    )
    (wheel,) = where.glob("pypepper_dramatiq-*.whl")
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", f"{wheel}[dashboard]"],
        check=True,
        timeout=900,
    )
    return venv / "bin"


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what points Python at the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    return {**env, **extra}


def test_the_wheel_installs_the_package_not_the_checkout(venv_bin: Path, tmp_path: Path) -> None:
    where = subprocess.run(
        [
            str(venv_bin / "python"),
            "-c",
            "import pypepper_dramatiq; print(pypepper_dramatiq.__file__)",
        ],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    assert str(venv_bin.parent) in where and str(ROOT) not in where
    assert (Path(where).parent / "py.typed").exists()
    assert list((Path(where).parent / "stores" / "migrations" / "versions").glob("0001_*.py"))


def test_the_readme_demo_runs_from_the_wheel(venv_bin: Path, tmp_path: Path) -> None:
    (demo,) = [b for b in python_blocks(README) if "Worker(manager.available" in b]
    (tmp_path / "demo.py").write_text(demo, encoding="utf-8")
    subprocess.run(
        [str(venv_bin / "python"), "demo.py"], cwd=tmp_path, env=clean_env(), check=True, timeout=60
    )


@pytest.fixture
def dashboard_port() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def test_the_readme_quick_start_cli_and_dashboard_run_from_the_wheel(
    venv_bin: Path,
    redis_url: str,
    empty_postgres_uri: str,
    tmp_path: Path,
    dashboard_port: list[subprocess.Popen[bytes]],
) -> None:
    flush_redis(redis_url)
    source = tasks_module(README).replace(PAGE_REDIS, redis_url)
    (tmp_path / "tasks.py").write_text(source.replace(PAGE_STORE, empty_postgres_uri), "utf-8")
    env = clean_env(PYTHONPATH=str(tmp_path))
    cli = str(venv_bin / "pypepper-dramatiq")
    subprocess.run([cli, "migrate", "--uri", empty_postgres_uri], env=env, check=True, timeout=60)
    processes = dashboard_port
    for n in (1, 2):
        with (tmp_path / f"worker-{n}.log").open("wb") as log:
            processes.append(
                subprocess.Popen(
                    [str(venv_bin / "dramatiq"), "tasks", "--processes", "1", "--threads", "8"],
                    cwd=tmp_path,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    for n in (1, 2):
        wait_for(
            lambda n=n: READY_LINE in (tmp_path / f"worker-{n}.log").read_text(),
            60,
            f"worker {n} to start",
        )
    job_id = subprocess.run(
        [
            str(venv_bin / "python"),
            "-c",
            "import tasks; print(tasks.submit('https://example.com'))",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()

    def shown() -> str | None:
        out = subprocess.run(
            [cli, "show", job_id, "--uri", empty_postgres_uri],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        return out if '"Completed"' in out else None

    assert '"url": "https://example.com"' in wait_for(shown, 60, "the job to complete")

    with (tmp_path / "dashboard.log").open("wb") as log:
        processes.append(
            subprocess.Popen(
                [
                    cli,
                    "dashboard",
                    "--uri",
                    empty_postgres_uri,
                    "--broker-url",
                    redis_url,
                    "--port",
                    "0",
                    "--import",
                    "tasks",
                ],
                cwd=tmp_path,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    url = wait_for(
        lambda: re.search(
            r"dashboard on (http://[\d.]+:\d+)/", (tmp_path / "dashboard.log").read_text()
        ),
        60,
        "the dashboard to start",
    ).group(1)
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{url}/jobs/{job_id}", timeout=10) as page:
                body = page.read().decode()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert job_id in body and "Completed" in body
