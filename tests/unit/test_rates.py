"""Rate limits as written (``"100/m"``): parsed at the boundary, refused by a typed
error naming the culprit."""

from __future__ import annotations

import pytest

from pypepper_dramatiq.errors import ConfigError, InvalidRateKeyError, InvalidRateLimitError
from pypepper_dramatiq.limits.rates import Rate, parse_rate
from pypepper_dramatiq.model.job import ScheduleOptions


@pytest.mark.parametrize(
    ("text", "count", "period"),
    [("100/m", 100, 60.0), ("5/s", 5, 1.0), ("3/h", 3, 3600.0), (" 7 / S ", 7, 1.0)],
)
def test_a_rate_is_a_count_per_second_minute_or_hour(text: str, count: int, period: float) -> None:
    rate = parse_rate(text)
    assert rate == Rate(count, period)
    assert rate.interval == period / count


def test_a_rate_prints_as_written() -> None:
    assert str(parse_rate("50/s")) == "50/s"
    assert str(parse_rate("100/m")) == "100/m"


@pytest.mark.parametrize("bad", ["100/x", "0/s", "-1/m", "abc", "", "1.5/s", "5/", "/s", 5, None])
def test_a_malformed_rate_is_a_typed_error_naming_it(bad: object) -> None:
    with pytest.raises(InvalidRateLimitError) as caught:
        parse_rate(bad, "rate_limit of channel 'etl'")
    assert "rate_limit of channel 'etl'" in str(caught.value)
    assert repr(bad) in str(caught.value)
    assert isinstance(caught.value, ConfigError)


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("", "an empty key"),
        (42, "a text is expected, not int"),
        (b"tenant", "a text is expected, not bytes"),
        ("k" * 200, "200 characters long"),
        ("a\x00b", "U\\+0000"),
    ],
)
def test_a_rate_key_that_is_no_key_is_refused_naming_it(bad: object, says: str) -> None:
    with pytest.raises(InvalidRateKeyError, match=f"rate_key .* is refused: .*{says}"):
        ScheduleOptions(rate_key=bad)  # type: ignore[arg-type]
