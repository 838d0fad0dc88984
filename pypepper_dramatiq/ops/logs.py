"""This package's loggers: no user text in a log line can forge a line or drive a terminal.

A job id, a category, a task name, a schedule name or an error goes into many of the
package's log messages. A newline in one would write a line of its own into the log
(a forged ``[INFO] ...``), an escape sequence would act on the terminal tailing it, a
bidi override would reorder what a reader sees. Every logger of the package is made by
:func:`get_logger`, which attaches :class:`PrintableFilter`: before any handler sees a
record, its message, its arguments and its traceback have each interpreted character
written as its visible escape (:func:`~pypepper_dramatiq.ops.display.printable`).

The filter sits on the logger, not on a handler: the handlers are the application's,
and a filter on a parent logger is not applied to the records of its children.
``extra=`` fields are left as given: they are structured data for machines (a JSON
formatter escapes them itself).
"""

from __future__ import annotations

import logging
import re
import traceback
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any

from .display import printable


class _EscapedText(str):
    """A ``str`` argument with interpreted characters: its value escaped, for ``%s``, and
    its ``repr`` the original's, escaped, for ``%r``."""

    _repr: str

    def __new__(cls, text: str) -> _EscapedText:
        shown = super().__new__(cls, printable(text))
        shown._repr = printable(repr(text))
        return shown

    def __repr__(self) -> str:
        return self._repr


class _EscapedObject:
    """Any other argument whose ``str`` or ``repr`` holds interpreted characters."""

    def __init__(self, value: object) -> None:
        self.value = value

    def __str__(self) -> str:
        return printable(str(self.value))

    def __repr__(self) -> str:
        return printable(repr(self.value))


def _escaped(value: Any) -> Any:
    """``value`` as a log argument that shows no interpreted character; itself when it
    shows none already (most are: numbers, ids, plain messages)."""
    if isinstance(value, str):
        return value if value.isprintable() else _EscapedText(value)
    if value is None or isinstance(value, (int, float)):
        return value
    try:
        if str(value).isprintable() and repr(value).isprintable():
            return value
    except Exception:  # a broken __str__: the formatter reports it as it always does
        return value
    return _EscapedObject(value)


def _each_exception(shown: traceback.TracebackException) -> Iterator[traceback.TracebackException]:
    """``shown`` and every exception chained to it (cause, context, group members)."""
    seen: set[int] = set()
    todo = [shown]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)
        todo.extend(getattr(current, "exceptions", None) or ())


#: A line break, as ``str.splitlines`` (and so a traceback's margins) finds one.
_LINE_BREAK = "(?:\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029])"
#: A line break and the margin the line before it had.
_BREAK = f"{_LINE_BREAK}(?P=margin)"


def traceback_text(exc: BaseException, tb: TracebackType | None) -> str:
    """The traceback ``logging.Formatter`` would print, with no line a message can forge.

    The frames keep their lines; each exception's own text (``Type: message`` and its
    notes), which is where user text sits, is written on one line, its newlines escaped
    (behind its margin, in an exception group). What is left at the start of a line is
    then only what a traceback itself writes.
    """
    shown = traceback.TracebackException(type(exc), exc, tb, compact=True)
    text = "".join(shown.format())
    for each in _each_exception(shown):
        own = "".join(each.format_exception_only()).removesuffix("\n")
        lines = re.split(_LINE_BREAK, own)
        if len(lines) > 1:  # a message, or notes, over several lines
            # The members of an exception group are shown behind a margin ("  | "),
            # written again after each line break.
            block = re.compile(
                "^(?P<margin>[ |]*)" + _BREAK.join(re.escape(line) for line in lines) + "$",
                re.MULTILINE,
            )
            text = block.sub("\\g<margin>" + printable(own).replace("\\", "\\\\"), text)
    return printable(text, keep="\n").removesuffix("\n")


class PrintableFilter(logging.Filter):
    """Escapes the user text of each record a logger of this package makes.

    It changes the record in place (the record is ours: made by our logger for this
    call) and always lets it through.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = printable(record.msg)
        else:
            record.msg = _escaped(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(_escaped(arg) for arg in record.args)
        elif isinstance(record.args, Mapping):
            record.args = {key: _escaped(arg) for key, arg in record.args.items()}
        if record.exc_info and not record.exc_text:
            _, exc, tb = record.exc_info
            if exc is not None:
                record.exc_text = traceback_text(exc, tb)
        return True


#: The one filter every logger of the package holds.
_FILTER = PrintableFilter()


def get_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)``, with :class:`PrintableFilter` attached (once).

    Every module of the package takes its logger here (``get_logger(__name__)``).
    """
    logger = logging.getLogger(name)
    logger.addFilter(_FILTER)  # a filter already there is not added again
    return logger
