"""The documentation's blocks that need servers, run as written against the test servers.

Each block is taken from its page as Sybil reads it; only the addresses it names are
pointed at the test servers (and the environment variables it reads are set). It runs
in a process of its own, as a reader's program would, followed by a few lines that
check what it made. The pages' other blocks run on the embedded default in
``tests/unit/test_docs_examples.py``; the distributed quick starts in
``test_docs_quickstart.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from pypepper_dramatiq.stores.sql import SqlJobStore

from .conftest import flush_redis
from .harness import DRAMATIQ, READY_LINE, wait_for
from .test_docs_quickstart import CLI, PAGE_REDIS, PAGE_STORE, ROOT, python_blocks

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]

#: The placeholders of the operations pages.
ANY_REDIS, ANY_STORE = '"redis://..."', '"postgresql+psycopg://..."'
#: The RabbitMQ address of the distributed page.
PAGE_RABBITMQ = "amqp://guest:guest@localhost:5672/%2F"


def block(page: str, holding: str) -> str:
    """The one python block of ``page`` whose text contains ``holding``."""
    found = [b for b in python_blocks(ROOT / page) if holding in b]
    assert len(found) == 1, f"{page}: {len(found)} blocks with {holding!r}"
    return found[0]


def run(source: str, check: str, tmp_path: Path, **env: str) -> str:
    """Run ``source`` then ``check`` as one program in ``tmp_path``; its output."""
    program = tmp_path / "page_block.py"
    program.write_text(source + "\n\n# -- the test's checks\n" + textwrap.dedent(check))
    done = subprocess.run(
        [sys.executable, str(program)],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(tmp_path), **env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"the block failed:\n{done.stdout}\n{done.stderr[-4000:]}"
    return done.stdout


@pytest.fixture
def migrated_uri(empty_postgres_uri: str) -> str:
    subprocess.run([CLI, "migrate", "--uri", empty_postgres_uri], check=True, timeout=60)
    return empty_postgres_uri


def test_the_rabbitmq_setup_of_the_distributed_page_runs(
    rabbitmq_url: str, migrated_uri: str, tmp_path: Path
) -> None:
    source = block("docs/howto/distributed.md", PAGE_RABBITMQ)
    source = source.replace(PAGE_RABBITMQ, rabbitmq_url).replace(PAGE_STORE, migrated_uri)
    out = run(
        source,
        """
        from pypepper_dramatiq.channels.broker import get_transport
        print(type(broker).__name__, get_transport().where)
        """,
        tmp_path,
    )
    assert out.split() == ["RabbitmqBroker", "PostgreSQL"]


def test_the_metrics_page_setup_runs_with_dramatiqs_prometheus_middleware(
    redis_url: str, migrated_uri: str, tmp_path: Path
) -> None:
    source = block("docs/operations/metrics.md", "Prometheus()")
    source = source.replace(ANY_REDIS, repr(redis_url)).replace(ANY_STORE, repr(migrated_uri))
    out = run(
        source,
        """
        from dramatiq.middleware.prometheus import Prometheus
        from pypepper_dramatiq.ops import observers
        print(sum(isinstance(m, Prometheus) for m in broker.middleware), observers.observing())
        """,
        tmp_path,
    )
    assert out.split() == ["1", "True"]


def test_the_tracing_page_setup_runs(redis_url: str, migrated_uri: str, tmp_path: Path) -> None:
    source = block("docs/operations/tracing.md", "ConsoleSpanExporter()")
    source = source.replace(ANY_REDIS, repr(redis_url)).replace(ANY_STORE, repr(migrated_uri))
    out = run(
        source,
        """
        from pypepper_dramatiq.ops import observers
        print(trace.get_tracer_provider() is provider, observers.observing())
        """,
        tmp_path,
    )
    assert out.split() == ["True", "True"]


def test_the_flask_mount_of_the_dashboard_page_answers_under_its_prefix(tmp_path: Path) -> None:
    source = block("docs/operations/dashboard.md", "from flask import Flask")
    out = run(
        source,
        """
        import base64
        from werkzeug.test import Client

        client = Client(app)
        ok = "Basic " + base64.b64encode(b"ops:s3cret").decode()
        print(client.get("/ops/jobs/").status_code,
              client.get("/ops/jobs/", headers={"Authorization": ok}).status_code,
              client.get("/elsewhere").status_code)
        """,
        tmp_path,
        DASHBOARD_PASSWORD="s3cret",
        DASHBOARD_SECRET="a-secret-of-this-test",
    )
    assert out.split() == ["401", "200", "404"]


#: The smallest Django project the page's ``mysite/wsgi.py`` block can load: one view of
#: the application's own at ``/``, so that the test sees both apps answer.
DJANGO_PROJECT = {
    "mysite/__init__.py": "",
    "mysite/settings.py": """
SECRET_KEY = "a-django-secret-of-this-test"
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "mysite.urls"
INSTALLED_APPS: list[str] = []
MIDDLEWARE: list[str] = []
""",
    "mysite/urls.py": """
from django.http import HttpResponse
from django.urls import path

urlpatterns = [path("", lambda request: HttpResponse("the application's own page"))]
""",
}


def test_the_django_mount_of_the_dashboard_page_answers_beside_the_django_app(
    tmp_path: Path,
) -> None:
    source = block("docs/operations/dashboard.md", "from django.core.wsgi import")
    for name, text_ in DJANGO_PROJECT.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text_))
    out = run(
        source,
        """
        import base64
        from werkzeug.test import Client

        client = Client(application)
        ok = "Basic " + base64.b64encode(b"ops:s3cret").decode()
        own = client.get("/")
        print(client.get("/ops/jobs/").status_code,
              client.get("/ops/jobs/", headers={"Authorization": ok}).status_code,
              own.status_code, "own page" in own.get_data(as_text=True),
              client.get("/elsewhere").status_code)
        """,
        tmp_path,
        DASHBOARD_PASSWORD="s3cret",
        DASHBOARD_SECRET="a-secret-of-this-test",
    )
    assert out.split() == ["401", "200", "200", "True", "404"]


def test_the_dashboard_module_for_gunicorn_serves_the_stored_jobs(
    redis_url: str, migrated_uri: str, tmp_path: Path
) -> None:
    source = block("docs/operations/dashboard.md", "# ops_dashboard.py")
    (tmp_path / "tasks.py").write_text("# the application's tasks (none needed here)\n")
    store = SqlJobStore(migrated_uri)
    store.close()
    out = run(
        source,
        """
        import base64
        from werkzeug.test import Client

        ok = "Basic " + base64.b64encode(b"ops:s3cret").decode()
        page = Client(app).get("/", headers={"Authorization": ok})
        print(page.status_code, "Jobs" in page.get_data(as_text=True))
        """,
        tmp_path,
        PYPEPPER_BROKER_URL=redis_url,
        PYPEPPER_STORE_URI=migrated_uri,
        DASHBOARD_PASSWORD="s3cret",
        PYPEPPER_DASHBOARD_SECRET_KEY="a-secret-of-this-test",
    )
    assert out.split() == ["200", "True"]


def test_the_transactional_page_runs_an_order_committed_and_none_rolled_back(
    redis_url: str, migrated_uri: str, tmp_path: Path
) -> None:
    flush_redis(redis_url)
    source = block("docs/howto/transactional-enqueue.md", "# orders.py")
    assert PAGE_REDIS in source and PAGE_STORE in source
    (tmp_path / "orders.py").write_text(
        source.replace(PAGE_REDIS, redis_url).replace(PAGE_STORE, migrated_uri)
    )
    engine = create_engine(migrated_uri)
    with engine.begin() as connection:  # the application's own table, as its migrations make
        connection.execute(text("CREATE TABLE orders (id integer PRIMARY KEY)"))
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [DRAMATIQ, "orders", "--processes", "1", "--threads", "2"],
            cwd=tmp_path,
            env=dict(os.environ, PYTHONPATH=str(tmp_path)),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: READY_LINE in log.read_text(), 60, "the worker to start")
        out_text = run(
            "from orders import *  # the page's module, as the worker imports it",
            """
            from sqlalchemy import select
            from sqlalchemy.orm import Session

            committed = place_order(7)
            # The same path rolled back: neither the order nor the job remains.
            job = Job(category="orders", channel_id="orders")
            job.workflows.append(Workflow([confirm.task(order_id=8)]))
            with Session(engine) as session:
                session.execute(insert(orders).values(id=8))
                rolled_back = job.scheduled(connection=session)
                session.rollback()
            with engine.connect() as connection:
                ids = sorted(connection.execute(select(orders.c.id)).scalars())
            print(committed, rolled_back, *ids)
            """,
            tmp_path,
        )
        committed, rolled_back, *ids = out_text.split()
        assert ids == ["7"]
        store = SqlJobStore(migrated_uri)
        try:
            record = wait_for(
                lambda: (r := store.get(committed)) is not None and r.status.is_terminal and r,
                60,
                "the committed order's job to end",
            )
            assert record.status.value == "Completed", record.error
            assert record.result("confirm") == 7
            assert store.get(rolled_back) is None
        finally:
            store.close()
    finally:
        worker.terminate()
        worker.wait(30)
        engine.dispose()
