"""A malformed ``broker_url`` is a ConfigError naming it, its password masked."""

from __future__ import annotations

import pytest

from pypepper_dramatiq import ConfigError, setup
from pypepper_dramatiq.channels.broker import get_broker
from pypepper_dramatiq.ops.display import masked_url

# -- broker_url -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "redis://user:s3cret@[::1:6379/0",
        "redis://:s3cret@localhost:port/0",
        "redis://:s3cret@localhost:99999/0",
    ],
    ids=["ipv6", "port", "port-range"],
)
def test_a_malformed_broker_url_is_a_config_error_naming_it_with_the_password_masked(
    url: str,
) -> None:
    pytest.importorskip("redis")
    before = get_broker()
    with pytest.raises(ConfigError, match=r"^broker_url 'redis://[^']*:\*\*\*@.*' is malformed"):
        setup(broker_url=url)
    assert get_broker() is before  # nothing installed


def test_a_malformed_broker_url_never_shows_its_password() -> None:
    pytest.importorskip("redis")
    for url in ("redis://u:s3cret@[::1", "http://u:s3cret@host", "redis://h:x?password=s3cret"):
        with pytest.raises(ConfigError, match="broker_url") as error:
            setup(broker_url=url)
        assert "s3cret" not in str(error.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://user:pw@host:6379/0", "redis://user:***@host:6379/0"),
        ("redis://:pw@host", "redis://:***@host"),
        ("redis://:p@w@[::1", "redis://:***@[::1"),
        ("redis://host/0?password=pw&db=1", "redis://host/0?password=***&db=1"),
        ("redis://host:6379/0", "redis://host:6379/0"),
        ("unix:///tmp/redis.sock", "unix:///tmp/redis.sock"),
        ("no url at all", "no url at all"),
    ],
)
def test_masked_url(url: str, shown: str) -> None:
    assert masked_url(url) == shown
