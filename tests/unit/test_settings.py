"""The timing settings: parsed once, checked once, named by where they came from."""

from __future__ import annotations

import pytest

from pypepper_dramatiq import ConfigError, WorkflowMiddleware
from pypepper_dramatiq.settings import Settings


def test_the_defaults_and_the_dispatch_rule_live_in_one_place() -> None:
    settings = Settings()
    assert settings.next_step_dispatch_seconds == 60.0
    assert Settings(lease_seconds=45).next_step_dispatch_seconds == 90.0
    assert Settings(dispatch_seconds=7).next_step_dispatch_seconds == 7.0
    middleware = WorkflowMiddleware()
    assert middleware.settings == settings
    assert middleware.book.dispatch_seconds == 60.0


def test_yaml_values_win_and_a_bad_one_is_named_by_its_key() -> None:
    settings = Settings.of({"leaseSeconds": 9, "shutdownGrace": 0}, lease_seconds=3)
    assert (settings.lease_seconds, settings.shutdown_grace) == (9.0, 0.0)
    with pytest.raises(ConfigError, match=r"scheduler\.heartbeatTimeoutMs"):
        Settings.of({"heartbeatTimeoutMs": 2.5})
    with pytest.raises(ConfigError, match=r"^sweep_interval must be"):
        Settings.of(sweep_interval=0)
    with pytest.raises(ConfigError, match="cancel_grace"):
        WorkflowMiddleware(cancel_grace=-1)
