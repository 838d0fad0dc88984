"""``logs.get_logger``: no user text in a record of ours forges a log line or drives a terminal."""

from __future__ import annotations

import builtins
import logging
import sys
import unicodedata
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pypepper_dramatiq.ops.logs import PrintableFilter, get_logger, traceback_text

#: What a line of text in a log reader must not hold: controls (newline, CR, ESC, BEL),
#: format characters (bidi overrides), line and paragraph separators, lone surrogates.
INTERPRETED = ("Cc", "Cf", "Zl", "Zp", "Cs")
FORGED = "boom\n[INFO] forged\r\x1b[2J\u202e"
FORGED_SHOWN = "boom\\n[INFO] forged\\r\\x1b[2J\\u202e"
LINE_FORMAT = "[%(levelname)s] %(message)s"
#: Exceptions carry notes, which a traceback shows under the message (Python 3.11+).
NOTES = sys.version_info >= (3, 11)


class Records(logging.Handler):
    """Keeps every record it is given, and each as LINE_FORMAT formats it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter(LINE_FORMAT))
        self.records: list[logging.LogRecord] = []
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.lines.append(self.format(record))


@pytest.fixture
def probe() -> Iterator[tuple[logging.Logger, Records]]:
    """A logger of the package (as a module's) and the records it makes."""
    logger = get_logger("pypepper_dramatiq.tests_probe")
    handler = Records()
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield logger, handler
    logger.removeHandler(handler)
    logger.setLevel(logging.NOTSET)


def interpreted(text: str) -> list[str]:
    return [char for char in text if unicodedata.category(char) in INTERPRETED]


def test_a_newline_in_an_argument_writes_no_line_of_its_own(
    probe: tuple[logging.Logger, Records],
) -> None:
    logger, handler = probe
    logger.info("job %s: task %s failed: %s", "job-1", "load", FORGED)
    [line] = handler.lines
    assert line == f"[INFO] job job-1: task load failed: {FORGED_SHOWN}"


def test_every_kind_of_argument_is_escaped(probe: tuple[logging.Logger, Records]) -> None:
    logger, handler = probe
    logger.warning("outcome write failed (%s); key %r", ValueError(FORGED), FORGED)
    logger.info("%(name)s at %(where)s", {"name": FORGED, "where": 3})
    logger.info(FORGED)  # a message made by the caller, with nothing to format
    assert handler.lines == [
        f"[WARNING] outcome write failed ({FORGED_SHOWN}); key '{FORGED_SHOWN}'",
        f"[INFO] {FORGED_SHOWN} at 3",
        f"[INFO] {FORGED_SHOWN}",
    ]


def test_harmless_arguments_and_extra_fields_are_left_as_given(
    probe: tuple[logging.Logger, Records],
) -> None:
    logger, handler = probe
    error = ValueError("plain")
    logger.info("job %s: %s, %d, %.1f", "job-1", error, 3, 0.5, extra={"error": FORGED})
    [record] = handler.records
    assert record.args == ("job-1", error, 3, 0.5) and record.args[1] is error
    assert record.error == FORGED  # structured, for machines: exact
    assert handler.lines == ["[INFO] job job-1: plain, 3, 0.5"]


def test_a_traceback_keeps_its_frames_and_forges_no_line(
    probe: tuple[logging.Logger, Records],
) -> None:
    logger, handler = probe

    def fail() -> None:
        try:
            raise RuntimeError("inner\n[INFO] forged inner")
        except RuntimeError as exc:
            raise ValueError(f"outer {FORGED}") from exc

    try:
        fail()
    except ValueError as exc:
        if NOTES:
            exc.add_note("a note\n[INFO] forged note")
        logger.exception("job %s: hook raised", "job-1")
    [text] = handler.lines
    lines = text.splitlines()
    assert lines[0] == "[ERROR] job job-1: hook raised"
    assert not any(line.startswith("[INFO]") for line in lines)
    # Each exception's text, its notes included, on one line; the frames indented.
    assert [line for line in lines if "[INFO]" in line and not line.startswith(" ")] == [
        "RuntimeError: inner\\n[INFO] forged inner",
        f"ValueError: outer {FORGED_SHOWN}" + ("\\na note\\n[INFO] forged note" if NOTES else ""),
    ]
    assert "Traceback (most recent call last):" in lines
    assert any(line.strip().startswith("raise ValueError(") for line in lines)  # the frames
    assert interpreted(text.replace("\n", "")) == []


def test_a_traceback_of_one_line_messages_is_the_usual_one(
    probe: tuple[logging.Logger, Records],
) -> None:
    logger, handler = probe
    try:
        raise RuntimeError("plain")
    except RuntimeError:
        logger.exception("it failed")
        usual = logging.Formatter(LINE_FORMAT).format(
            logging.LogRecord("x", logging.ERROR, __file__, 1, "it failed", None, sys.exc_info())
        )
    assert handler.lines == [usual]


@given(st.text(st.characters(codec=None)), st.text(st.characters(codec=None)))
def test_no_text_leaves_an_interpreted_character_in_the_line(arg: str, message: str) -> None:
    logger = get_logger("pypepper_dramatiq.tests_property")
    handler = Records()
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        logger.info("a %s, a %r, an error: %s", arg, arg, ValueError(arg))
        logger.info(message.replace("%", "%%"))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
    assert [interpreted(line) for line in handler.lines] == [[], []]


def test_get_logger_attaches_the_filter_once() -> None:
    logger = get_logger("pypepper_dramatiq.tests_once")
    assert get_logger("pypepper_dramatiq.tests_once") is logger
    assert [f for f in logger.filters if isinstance(f, PrintableFilter)] == logger.filters
    assert len(logger.filters) == 1


@pytest.mark.skipif(not NOTES, reason="exception groups are Python 3.11+")
def test_the_members_of_an_exception_group_forge_no_line_behind_their_margin(
    probe: tuple[logging.Logger, Records],
) -> None:
    logger, handler = probe
    group = builtins.__dict__["ExceptionGroup"]
    try:
        raise group("several\n[INFO] forged", [ValueError(FORGED), KeyError("plain")])
    except Exception:
        logger.exception("hooks failed")
    lines = handler.lines[0].splitlines()
    assert "  | ExceptionGroup: several\\n[INFO] forged (2 sub-exceptions)" in lines
    assert f"    | ValueError: {FORGED_SHOWN}" in lines
    assert not any(line.lstrip(" |").startswith("[INFO]") for line in lines)


@given(st.text(st.characters(codec=None)), st.text(st.characters(codec=None)))
def test_no_exception_text_starts_a_line_of_the_traceback(message: str, note: str) -> None:
    try:
        try:
            raise RuntimeError(note)
        except RuntimeError as inner:
            if NOTES:
                inner.add_note(note)
            raise ValueError(message) from inner
    except ValueError as exc:
        text = traceback_text(exc, exc.__traceback__)
    written_by_the_traceback = (
        "",
        "Traceback (most recent call last):",
        "The above exception was the direct cause of the following exception:",
    )
    for line in text.split("\n"):
        assert interpreted(line) == []
        assert (
            line.startswith(("  ", "ValueError", "RuntimeError"))
            or line in written_by_the_traceback
        ), line
    assert text.count("\nValueError") == text.count("\nRuntimeError") == 1


def test_every_logger_of_the_package_holds_the_filter() -> None:
    import importlib
    import pkgutil

    import pypepper_dramatiq

    for module in pkgutil.walk_packages(pypepper_dramatiq.__path__, "pypepper_dramatiq."):
        if module.name.endswith("__main__") or ".migrations" in module.name:
            continue  # runs the command line; alembic's scripts
        importlib.import_module(module.name)
    pypepper_dramatiq.WorkflowMiddleware()  # its logger is made per instance
    ours = {
        name: logger
        for name, logger in logging.Logger.manager.loggerDict.items()
        if name.startswith("pypepper_dramatiq.") and isinstance(logger, logging.Logger)
    }
    assert "pypepper_dramatiq.engine.step_io" in ours
    assert "pypepper_dramatiq.drivers.dramatiq.middleware.WorkflowMiddleware" in ours
    # Dramatiq names an actor's own logger "<module>.<actor name>", and our actors' names
    # are "pypepper_dramatiq.<...>": such a logger is Dramatiq's, not one of ours.
    actors = {name for name in ours if name.count("pypepper_dramatiq.") > 1}
    without = [
        name
        for name, logger in ours.items()
        if name not in actors and not any(isinstance(f, PrintableFilter) for f in logger.filters)
    ]
    assert without == [], "take the logger with logs.get_logger(__name__)"
