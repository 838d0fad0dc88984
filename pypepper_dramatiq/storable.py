"""What the job store can hold: the one rule for text and values at every write.

Two halves. Values a user gives (ids, channel ids, categories, unique keys, task
parameters, schedule names) are *checked* where they enter (``check_text``): a
value the row cannot hold is a ``ValueError`` naming the field and its limit,
and nothing is stored or sent. Text the engine itself writes (errors, tracebacks,
progress notes) is *made* storable (``storable_text``): the code points no store
can keep are escaped visibly, never dropped, so that an error always reaches
the row.

What no store keeps: NUL (PostgreSQL's ``text`` and ``jsonb`` refuse it) and
lone surrogates (not encodable as UTF-8, which every store's driver sends).
"""

from __future__ import annotations

import re

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


def check_text(field: str, value: str, limit: int | None = None) -> str:
    """``value`` if a row can hold it as ``field``; else ``ValueError`` naming the field.

    Args:
        field: the name the user knows the value by (``"category"``, ``"unique_key"``).
        value: the text.
        limit: the most characters the column holds (None: no limit).
    """
    bad = unstorable_in(value)
    if bad is not None:
        raise ValueError(f"{field} holds {bad}, which the job store cannot keep")
    if limit is not None and len(value) > limit:
        raise ValueError(f"{field} is {len(value)} characters long; at most {limit} are stored")
    return value
