"""What the job store can hold: the one rule for text and values at every write.

Two halves. Values a user gives (ids, channel ids, categories, unique keys, task
parameters, schedule names) are *checked* where they enter (``check_text``): a
value the row cannot hold is an ``UnstorableValueError`` (a ``ValueError``) naming
the field and its limit, and nothing is stored or sent. Text the engine itself
writes (errors, tracebacks, progress notes) is *made* storable (``storable_text``):
the code points no store can keep are escaped visibly, never dropped, so that an
error always reaches the row.

What no store keeps: NUL (PostgreSQL's ``text`` and ``jsonb`` refuse it) and
lone surrogates (not encodable as UTF-8, which every store's driver sends).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from ..errors import UnstorableValueError

# -- column limits: the one definition (``stores/schema.py`` builds its columns from them) --

#: A job id (``scheduler_jobs.id``, and every column naming a job).
ID_LENGTH = 64
#: A channel id (``scheduler_jobs.channel_id``), also the name of its queue.
CHANNEL_ID_LENGTH = 128
#: A job's category (``scheduler_jobs.category``).
CATEGORY_LENGTH = 128
#: A unique key (``scheduler_jobs.unique_key``): 191 characters of utf8mb4 are the
#: 764 bytes MySQL indexes at most.
UNIQUE_KEY_LENGTH = 191
#: A status name (``scheduler_jobs.status``).
STATUS_LENGTH = 16
#: A worker's lease owner id (``scheduler_jobs.lease_owner``, ``scheduler_workers.owner``).
LEASE_OWNER_LENGTH = 128
#: A recurring schedule's name (``scheduler_recurring.name``).
SCHEDULE_NAME_LENGTH = 128
#: A recurring schedule's cron expression (``scheduler_recurring.cron``).
CRON_LENGTH = 255
#: A recurring schedule's time zone name (``scheduler_recurring.timezone``).
TIMEZONE_LENGTH = 64
#: A recurring schedule's ``overlap`` and ``catch_up`` choices, and a link's kind.
CHOICE_LENGTH = 8
#: A paused channel's name or task's executor id (``scheduler_paused.name``): 191
#: characters of utf8mb4 fit MySQL's index with the kind.
PAUSED_NAME_LENGTH = 191
#: A rate limit's key (``scheduler_rate_turns.key``): ``channel:`` and a channel's name.
RATE_KEY_LENGTH = 160
#: A job's rate limit key (``scheduled(rate_key=)``, in its payload).
RATE_KEY_TEXT_LENGTH = 128
#: A concurrency slot's key (``scheduler_concurrency_slots.key``): ``channel:`` and a
#: channel's name, or ``key:`` and a job's concurrency key.
CONCURRENCY_SLOT_KEY_LENGTH = 160
#: A job's concurrency key (``scheduled(concurrency_key=)``, in its payload).
CONCURRENCY_KEY_TEXT_LENGTH = 128
#: Who holds a concurrency slot (``scheduler_concurrency_slots.holder``): a worker's
#: owner id, the job's id and a token.
CONCURRENCY_HOLDER_LENGTH = 255
#: A rate limit as written (``scheduler_rate_turns.rate_limit``): ``10000/h``.
RATE_TEXT_LENGTH = 16
#: A worker's host name (``scheduler_workers.host``).
HOST_LENGTH = 255
#: The Dramatiq version a worker runs (``scheduler_workers.dramatiq_version``).
VERSION_LENGTH = 32
#: The levels of arrays and objects a JSON column's document may nest: MariaDB's
#: ``JSON_VALID`` check refuses a document 32 levels deep (MySQL allows 100).
JSON_DEPTH = 31

#: Code points no store keeps: NUL and the surrogates (which a ``str`` can hold alone).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return "\\x00" if code == 0 else f"\\u{code:04x}"


def unstorable_in(text: str) -> str | None:
    """The first code point of ``text`` that no store keeps, as ``U+XXXX``; None if none."""
    found = _UNSTORABLE.search(text)
    return None if found is None else f"U+{ord(found.group()):04X}"


def storable_text(text: str) -> str:
    """``text`` with each code point no store keeps written as its escape
    (``\\x00``, ``\\udc80``): what the engine stores of text it did not choose."""
    return text if _UNSTORABLE.search(text) is None else _UNSTORABLE.sub(_escaped, text)


#: The characters of error text the engine stores in a row's ``error``: 16,000
#: characters of utf8mb4 are 64,000 bytes at most, within MySQL's TEXT (65,535 bytes);
#: PostgreSQL's text has no limit, but an error that long is read by no one whole.
ERROR_LENGTH = 16_000


def clipped(text: str, limit: int, *, keep_end: bool = False) -> str:
    """``text`` in at most ``limit`` characters: its start (or with ``keep_end`` its
    end, where a traceback names the raising frame), ``...`` marking the cut."""
    if len(text) <= limit:
        return text
    if keep_end:
        return "..." + text[-(limit - 3) :]
    return text[: limit - 3] + "..."


def storable_error(text: str) -> str:
    """``text`` (an error the engine stores in a row) made storable: escaped as by
    :func:`storable_text`, and :func:`clipped` to :data:`ERROR_LENGTH` characters."""
    return clipped(storable_text(text), ERROR_LENGTH)


def check_text(field: str, value: str, limit: int | None = None) -> str:
    """``value`` if a row can hold it as ``field``; else an ``UnstorableValueError``
    naming the field.

    Args:
        field: the name the user knows the value by (``"category"``, ``"unique_key"``).
        value: the text.
        limit: the most characters the column holds (None: no limit).
    """
    bad = unstorable_in(value)
    if bad is not None:
        raise UnstorableValueError(field, f"holds {bad}, which the job store cannot keep")
    if limit is not None and len(value) > limit:
        raise UnstorableValueError(
            field, f"is {len(value)} characters long; at most {limit} are stored"
        )
    return value


def check_json(field: str, value: Any, depth: int = 0) -> Any:
    """``value`` if a JSON column can hold it as ``field``; else an
    ``UnstorableValueError`` naming where in it the culprit sits (``params['a'][0]``).

    Refused: a string (a mapping's keys included) holding a code point no store
    keeps, a float that is not finite (JSON has no NaN or infinity: PostgreSQL
    refuses it), a value nested deeper than :data:`JSON_DEPTH`, and what JSON
    cannot hold at all (a set, an object, a key that is not a string, a number,
    a bool or None).

    Args:
        field: the name the user knows the value by.
        value: the value.
        depth: how many arrays and objects hold ``value`` in its column's document
            (0: ``value`` is the document).
    """
    checked_json_text(field, value, depth)
    return value


def checked_json_text(field: str, value: Any, depth: int = 0) -> str:
    """:func:`check_json`'s check of ``value``, returning the JSON text a store writes
    of it (as :func:`json_text` spells it): the check's one ``json.dumps`` serves the
    write too, where the job's payload was encoded again for its row.

    The text keeps non-ASCII characters as they are, where :func:`json_text` escapes
    them (``\\u00e9``): a JSON column reads both as the same value.

    Raises:
        UnstorableValueError: as :func:`check_json`.
    """
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        text = None  # the walk below names the culprit
    # JSON writes a NUL as the escape \u0000 (a literal backslash-u0000 in a string
    # matches too: then the walk finds nothing wrong).
    if (
        text is None
        or "\\u0000" in text
        or _UNSTORABLE.search(text) is not None
        or _nests_deeper(text, JSON_DEPTH - depth)
    ):
        _walk(field, value, depth)
    if text is None:  # refused by json.dumps, yet the walk found nothing to name
        return json_text(value)
    return _spelled_out_numbers(text)  # the common case: a pass or two over the text


#: A JSON string (skipped as it is), or a number written with a positive exponent.
_STRING_OR_EXPONENT = re.compile(r'("(?:[^"\\]|\\.)*")|(-?\d+(?:\.\d+)?[eE]\+\d+)')


def _spelled_out(match: re.Match[str]) -> str:
    if match.group(1) is not None:
        return match.group(1)
    digits = f"{Decimal(match.group(2)):f}"
    return digits if "." in digits else digits + ".0"


def json_text(value: Any) -> str:
    """The JSON text of ``value`` as every store writes it into a JSON column.

    ``json.dumps``, except that a float written with a positive exponent (Python's
    form from 1e16: ``8.850783147909827e+16``) is spelled out with a fraction
    (``88507831479098270.0``). PostgreSQL's ``jsonb`` keeps numbers as ``numeric``,
    which prints the exponent form without a fraction: read back, the float was an
    int (and not of the float's exact value). Spelled out, it reads back as the
    same float. Ints never take an exponent, so no int changes.
    """
    return _spelled_out_numbers(json.dumps(value))


def _spelled_out_numbers(text: str) -> str:
    """The JSON ``text`` with each float's exponent spelled out (see :func:`json_text`)."""
    if "e+" not in text and "E+" not in text:
        return text  # the common case: nothing to spell out
    return _STRING_OR_EXPONENT.sub(_spelled_out, text)


#: A JSON string, escapes included; and what is not an array's or object's bracket.
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def _nests_deeper(text: str, levels: int) -> bool:
    """Whether the arrays and objects of the JSON ``text`` nest more than ``levels`` deep."""
    if text.count("[") + text.count("{") <= levels:
        return False  # too few brackets to nest that deep, whatever the strings hold
    depth = 0
    for bracket in _NOT_BRACKET.sub("", _JSON_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        if depth > levels:
            return True
    return False


def _walk(where: str, value: Any, depth: int) -> None:
    if value is None or isinstance(value, (bool, int)):
        return
    if isinstance(value, str):
        check_text(where, value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise UnstorableValueError(where, f"is {value!r}, which JSON cannot hold")
    elif isinstance(value, (Mapping, list, tuple)):
        if depth >= JSON_DEPTH:
            shown = where if len(where) <= 80 else f"{where[:77]}..."
            raise UnstorableValueError(
                shown,
                f"is nested too deep: a JSON column holds at most {JSON_DEPTH} "
                "levels of arrays and objects",
            )
        if isinstance(value, Mapping):
            for key, item in value.items():
                if isinstance(key, str):
                    check_text(f"the key {key[:40]!r} of {where}", key)
                elif not (key is None or isinstance(key, (bool, int, float))):
                    raise UnstorableValueError(
                        where, f"has a key of type {type(key).__name__}, not a string"
                    )
                _walk(f"{where}[{key!r:.40}]", item, depth + 1)
        else:
            for index, item in enumerate(value):
                _walk(f"{where}[{index}]", item, depth + 1)
    else:
        raise UnstorableValueError(where, f"holds a {type(value).__name__}, which JSON cannot hold")
