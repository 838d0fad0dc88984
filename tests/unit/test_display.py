"""``display.printable``: user text made safe to show, for any text at all."""

from __future__ import annotations

import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from pypepper_dramatiq.ops.display import printable

#: The categories printable escapes: controls, format characters (bidi, zero-width),
#: line and paragraph separators, lone surrogates.
INTERPRETED = ("Cc", "Cf", "Zl", "Zp", "Cs")


def interpreted(text: str) -> list[str]:
    return [char for char in text if unicodedata.category(char) in INTERPRETED]


@given(st.text(st.characters(codec=None)))
def test_no_interpreted_character_is_left_in_any_text(text: str) -> None:
    assert interpreted(printable(text)) == []


@given(st.text(st.characters(exclude_categories=INTERPRETED)))  # type: ignore[arg-type]
def test_text_with_nothing_to_escape_is_kept_as_it_is(text: str) -> None:
    assert printable(text) == text


@given(st.text(st.characters(codec=None)))
def test_escaping_twice_changes_nothing_more(text: str) -> None:
    once = printable(text)
    assert printable(once) == once


@given(st.text(st.characters(codec=None)))
def test_each_character_is_kept_or_written_as_its_visible_escape(text: str) -> None:
    assert printable(text) == "".join(printable(char) for char in text)
    for char in text:
        shown = printable(char)
        if interpreted(char):
            assert shown.startswith("\\") and shown.isascii() and shown.isprintable()
        else:
            assert shown == char


def test_a_terminal_title_escape_and_a_forged_log_line_are_shown_not_run() -> None:
    assert printable("a\x1b]0;pwned\x07\x1b[2J") == "a\\x1b]0;pwned\\x07\\x1b[2J"
    assert printable("boom\n[INFO] forged\r") == "boom\\n[INFO] forged\\r"
    assert printable("abc\u202edef\u200b") == "abc\\u202edef\\u200b"
    assert printable("\ud800") == "\\ud800"


def test_keep_leaves_line_breaks_and_tabs_only() -> None:
    assert printable("a\n\tb\x1b", keep="\n\t") == "a\n\tb\\x1b"
    assert printable("a\x1b", keep="\x1b") == "a\\x1b"  # only layout may be kept
