"""Escaping of untrusted strings for GitLab Markdown code spans and Mermaid labels."""

from __future__ import annotations

from sinks.gitlab.escape import code, mermaid_alias, mermaid_string, mermaid_text, one_line, plain, title_text


def test_code_span_cannot_be_left() -> None:
    """Backticks, line breaks and (in cells) pipes cannot end the span, the line or the cell."""
    assert code("a`b\nc|d") == "`a'b c|d`"
    assert code("a|b", cell=True) == "`a\\|b`"
    assert code("") == "—" and code("\n\t ") == "—"
    assert code("x" * 500, limit=10) == "`xxxxxxxxx…`"


def test_one_line_strips_breaks_and_invisible_characters() -> None:
    """Unicode line and paragraph separators, NEL, NUL and bidi overrides are gone."""
    assert one_line("a\u2028b\u2029c\x85d\x00e\u202ef\r\ng") == "a b c d ef g"


def test_mermaid_text_has_no_syntax() -> None:
    """Separators, comments, directives, arrows, HTML and fences become inert look-alikes."""
    text = mermaid_text("a; b # c %%{init}%% d --> e ->> f <br> ``` g >= 1")
    for bad in (";", "#", "%%", "-->", "->>", "--", "<", ">", "`"):
        assert bad not in text, bad
    assert "\u2265 1" in text and mermaid_text("") == "-"
    assert mermaid_text("---x") == "-\u2010-x"


def test_mermaid_alias_keeps_a_safe_subset() -> None:
    """Aliases keep letters, digits, _ . / and single spaces."""
    assert mermaid_alias("shop.handlers.capture_payment") == "shop.handlers.capture_payment"
    assert mermaid_alias("orders:42; participant X-->Y") == "orders 42 participant X Y"
    assert mermaid_alias(";;;") == "unknown"


def test_title_is_one_line_and_bounded() -> None:
    """Titles fit GitLab's 255 characters on one line."""
    assert title_text("a\nb") == "a b" and len(title_text("x" * 400)) == 255


def test_plain_text_has_no_live_reference() -> None:
    """Reference sigils before a name, number or quote become fullwidth; prose punctuation is kept."""
    assert plain('@everyone #12 !3 ~bug ~"x y" %v1 $4 &5 ^alert') == (
        '\uff20everyone \uff0312 \uff013 \uff5ebug \uff5e"x y" \uff05v1 \uff044 \uff065 \uff3ealert'
    )
    assert plain("50% done & more! #\n/close") == "50% done & more! # /close"


def test_mermaid_string_is_one_quoted_text() -> None:
    """A chart title is quoted once: inner quotes, separators and comments are inert."""
    assert mermaid_string('a "b"; %%c') == "\"a 'b'\uff1b \uff05\uff05c\""
    assert mermaid_string("") == '"-"'
