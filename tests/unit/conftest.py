"""Fixtures for the model and the in-process driver (embedded default, no servers)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from dramatiq.brokers.stub import StubBroker
from process_state import clean_process_state


@pytest.fixture(autouse=True)
def fresh_process_state() -> Iterator[StubBroker]:
    """Each test starts with a new stub broker, no channels, no config, the default store."""
    stub = StubBroker()
    with clean_process_state(stub):
        yield stub
    stub.close()
