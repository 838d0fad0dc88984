"""Text for people: user text made safe to show on a terminal, in a log or on a page.

A category, a schedule name or an error may hold characters that a terminal or a
browser interprets rather than shows: escape sequences (ESC, BEL), line breaks
that forge a new log line, bidi overrides that reorder what follows, zero-width
characters that make two names look alike. ``printable`` writes each of them as
its visible escape (``\\x1b``, ``\\n``, ``\\u202e``); every other character is
kept. Stored text is never changed: this is applied where text is shown.
"""

from __future__ import annotations

import re
import unicodedata

#: Line breaks and tabs a caller may keep (a traceback shown as a block).
_LAYOUT = "\n\t"


def _interpreted(char: str) -> bool:
    # Cc: C0 and C1 controls (ESC, BEL, CR, NUL...); Cf: format characters (bidi
    # embeddings, overrides and isolates, zero-width space and joiners, the BOM);
    # Zl / Zp: the line and paragraph separators; Cs: a lone surrogate.
    return unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp", "Cs")


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char, f"\\x{code:02x}")
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def printable(text: str, *, keep: str = "") -> str:
    """``text`` with each character a terminal or browser would interpret escaped.

    Args:
        text: user text (a name, a category, an error).
        keep: characters to leave as they are, among ``"\\n\\t"`` (a block of text
            shown as lines, such as a traceback on a page).
    """
    if text.isprintable():  # no control, format, separator or surrogate: the fast path
        return text
    kept = set(keep) & set(_LAYOUT)
    return "".join(
        _escape(char) if char not in kept and _interpreted(char) else char for char in text
    )


#: A password given as a URL's query parameter (``redis://host?password=...``).
_QUERY_PASSWORD = re.compile(r"(?i)([?&]password=)[^&#]*")


def masked_url(url: str) -> str:
    """``url`` with its password written ``***``: in its user info (``user:***@``) and
    in a ``password=`` query parameter. Made to show a URL in an error, it parses
    nothing strictly, so a malformed URL (the one an error is about) is masked too."""
    scheme, found, rest = url.partition("://")
    if found:
        at = rest.rfind("@")
        userinfo = rest[:at] if at >= 0 else ""
        if ":" in userinfo:
            rest = f"{userinfo.split(':', 1)[0]}:***{rest[at:]}"
        url = f"{scheme}://{rest}"
    return _QUERY_PASSWORD.sub(r"\1***", url)
