"""``EndPublishing``: a worker process publishes job ends only while someone listens."""

from __future__ import annotations

from pypepper_dramatiq.channels.end_notices import EndPublishing


def quiet_since(at: float) -> EndPublishing:
    """An audience that hears announcements and whose PUBLISH at ``at`` reached nobody."""
    audience = EndPublishing(quiet_seconds=5)
    audience.hearing(True)
    epoch = audience.ask(at)
    assert epoch is not None
    audience.answered(0, epoch, at)
    return audience


def test_a_process_that_hears_no_announcements_publishes_every_end() -> None:
    audience = EndPublishing(quiet_seconds=5)
    epoch = audience.ask(0.0)
    assert epoch is not None
    audience.answered(0, epoch, 0.0)  # nobody got it: but nobody could tell us otherwise
    assert audience.ask(1.0) is not None


def test_an_end_nobody_got_makes_a_hearing_process_quiet_for_a_while() -> None:
    audience = quiet_since(10.0)
    assert audience.ask(10.1) is None
    assert audience.ask(14.9) is None
    assert audience.ask(15.0) is not None  # then one PUBLISH asks again


def test_an_end_somebody_got_keeps_it_publishing() -> None:
    audience = EndPublishing(quiet_seconds=5)
    audience.hearing(True)
    epoch = audience.ask(0.0)
    assert epoch is not None
    audience.answered(1, epoch, 0.0)
    assert audience.ask(0.1) is not None


def test_an_announcement_ends_the_quiet_at_once() -> None:
    audience = quiet_since(0.0)
    assert audience.ask(1.0) is None
    audience.heard()
    assert audience.ask(1.0) is not None


def test_a_nobody_answer_older_than_an_announcement_silences_nothing() -> None:
    audience = EndPublishing(quiet_seconds=5)
    audience.hearing(True)
    epoch = audience.ask(0.0)  # a PUBLISH leaves, before the listener subscribed
    assert epoch is not None
    audience.heard()  # the listener announces itself meanwhile
    audience.answered(0, epoch, 0.1)  # the stale answer comes back
    assert audience.ask(0.2) is not None


def test_losing_the_hearing_means_publishing_again() -> None:
    audience = quiet_since(0.0)
    assert audience.ask(1.0) is None
    audience.hearing(False)  # announcements could be missed now
    assert audience.ask(1.0) is not None
    epoch = audience.ask(1.0)
    assert epoch is not None
    audience.answered(0, epoch, 1.0)
    assert audience.ask(2.0) is not None
