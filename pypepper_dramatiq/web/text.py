"""User text on a page: what the templates print, made visible rather than interpreted.

A name, an id, a category or an error may hold bidi overrides that reorder what a
reader sees, zero-width characters that make two names look alike, or controls.
Every text a template prints goes through :func:`shown` (the Jinja environment's
``finalize``), which writes each of them as its visible escape
(:func:`~pypepper_dramatiq.ops.display.printable`), so that no template can forget it.
Two filters say where text is printed otherwise:

* ``block``: a block of lines (an error, a traceback, JSON) in a ``<pre>``, its
  line breaks and tabs kept;
* ``verbatim``: a form field's value, kept as the user typed it (escaped only), so
  that a filter sent again is the same filter;
* ``field``: a value a form sends back exactly (a job id in a bulk form), its
  control and format characters written as character references: the browser
  sends them as they are, and the page holds none of them.

The stylesheet wraps long text and isolates each piece of user text
(``unicode-bidi: isolate``) so that right-to-left text cannot move its neighbours.
"""

from __future__ import annotations

import unicodedata
from typing import Any

from markupsafe import Markup, escape

from ..ops.display import printable

#: What a block keeps as it is: its layout.
BLOCK_LAYOUT = "\n\t"


def shown(value: Any) -> Any:
    """A value a template prints: text with its interpreted characters escaped
    visibly; markup a filter made, and other values, as they are."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return printable(value)
    return value


def block(value: Any) -> Markup:
    """The ``block`` filter: text shown as lines (in a ``<pre>``), escaped for HTML,
    its line breaks and tabs kept, every other interpreted character made visible."""
    return escape(printable(str(value), keep=BLOCK_LAYOUT))


def verbatim(value: Any) -> Markup:
    """The ``verbatim`` filter: a form field's value as it was given, escaped for HTML."""
    return escape(value)


def field(value: Any) -> Markup:
    """The ``field`` filter: a value sent back by a form as it is, escaped for HTML,
    its control and format characters (bidi controls, zero-width ones) written as
    numeric character references."""
    return Markup(
        "".join(
            f"&#x{ord(char):X};" if unicodedata.category(char) in ("Cc", "Cf") else char
            for char in str(escape(value))
        )
    )
