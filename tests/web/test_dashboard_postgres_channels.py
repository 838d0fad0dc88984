"""The channels page with RabbitMQ: the channels as the processes share them, in the
PostgreSQL job store (the PostgreSQL transport), and said so when it cannot be read."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from werkzeug.test import Client

from pypepper_dramatiq.channels.broker import set_broker, transport_of
from pypepper_dramatiq.drivers.dramatiq.setup import setup
from pypepper_dramatiq.stores.sql import SqlJobStore
from pypepper_dramatiq.transport.postgres.gate import PostgresGate
from pypepper_dramatiq.web import make_app

pytestmark = pytest.mark.postgres

#: Never dialled: the page reads the channels in PostgreSQL, not in RabbitMQ.
NOWHERE = "amqp://guest:guest@127.0.0.1:1/%2F"


@pytest.fixture
def broker(pg_store: SqlJobStore) -> Iterator[RabbitmqBroker]:
    made = RabbitmqBroker(url=NOWHERE)
    setup(broker=made, store_uri=pg_store.engine.url.render_as_string(hide_password=False))
    yield made
    set_broker(None)


def test_the_channels_page_reads_the_channel_rows_in_postgresql(
    broker: RabbitmqBroker, pg_store: SqlJobStore
) -> None:
    bounded, stopped = (f"web-{uuid.uuid4().hex[:8]}" for _ in range(2))
    assert PostgresGate(pg_store.engine, bounded, 3).admit("job-1") == "ok"
    PostgresGate(pg_store.engine, stopped).request_stop()

    page = Client(make_app(broker=broker)).get("/channels").get_data(as_text=True)

    assert "As kept in PostgreSQL." in page
    row = page.split(f">{bounded}</a>", 1)[1].split("</tr>", 1)[0]
    assert "<td>1</td>" in row and "<td>3</td>" in row and ">no<" in row
    row = page.split(f">{stopped}</a>", 1)[1].split("</tr>", 1)[0]
    assert "unbounded" in row and ">stopped<" in row


def test_a_postgresql_that_cannot_be_read_is_named_on_the_page(
    broker: RabbitmqBroker, pg_store: SqlJobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = make_app(broker=broker)

    def down() -> None:
        raise OSError("connection refused (test)")

    monkeypatch.setattr(transport_of(broker), "channel_states", down)
    response = Client(app).get("/channels")
    assert response.status_code == 200
    assert "PostgreSQL cannot be read: connection refused (test)" in response.get_data(as_text=True)
