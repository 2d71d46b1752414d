"""Escaping of untrusted strings (statements, parameters, function names, exceptions) for GitLab Markdown and Mermaid.

Markdown: every untrusted value is shown as an inline code span on one line. Inside a code span GitLab neither
parses Markdown nor expands references, so ``@user``, ``#12``, ``!3`` or ``~label`` in a statement never notify
anyone or link anything, and HTML is shown literally. What could still break out is removed: line breaks and other
control characters become spaces, backticks become ``'``, and in table cells ``|`` is escaped as ``\\|``.

Mermaid: labels are single-line message texts. The sequence-diagram grammar ends a text at a newline, ``;`` or
``#``, treats ``%%`` as a comment or a directive and ``<``/``>`` as arrows or HTML, so those characters are
replaced by look-alikes that carry no syntax (the fullwidth semicolon, number and percent signs, single angle
quotation marks), a dash pair by a dash and a hyphen, and backticks (which could close the fence) by ``'``.
Participant aliases are stricter still: only letters, digits and ``_ . /`` survive. A quoted string of an
``xychart-beta`` (chart title) is a message text without ``"``.

Titles are plain text (no code span), and GitLab links references in them: untrusted parts of a title go
through :func:`plain`, which turns every reference sigil followed by a name or a number (``@user``, ``#12``,
``!3``, ``~bug``, ``%v1``, ``$4``, ``&5``, ``^alert``) into its fullwidth look-alike, which GitLab does not parse,
breaks URL schemes (``https://...``, which GitLab would link and cross-reference) with division slashes, and
turns a leading ``/`` (a quick action at the start of a line) into a fullwidth solidus. A title is one line that
starts with ``[trace-repro]``, so it never holds a quick action (``/close``) anyway; :func:`plain` text is also
safe in Markdown prose outside code spans (a word such as an anomaly's name), as long as it is not a table cell.
"""

from __future__ import annotations

import re

_BREAKS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")
_INVISIBLE = re.compile(r"[\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")
_MERMAID = str.maketrans({"`": "'", ";": "\uff1b", "#": "\uff03", "%": "\uff05", "<": "\u2039", ">": "\u203a"})
_ALIAS = re.compile(r"[^A-Za-z0-9_./]+")
_SIGIL = re.compile(r"[@#!~%$&^](?=[\w\"'])")
_FULLWIDTH = {c: chr(ord(c) + 0xFEE0) for c in "@#!~%$&^"}
_SCHEME = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*):/{2}")


def one_line(value: object, limit: int = 300) -> str:
    """``value`` as text on one line, without invisible or control characters, at most ``limit`` characters."""
    text = _INVISIBLE.sub("", _BREAKS.sub(" ", str(value))).strip()
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def code(value: object, *, cell: bool = False, limit: int = 300) -> str:
    """An inline code span that no untrusted content can leave; ``cell=True`` for a Markdown table cell."""
    text = one_line(value, limit).replace("`", "'")
    if not text:
        return "—"
    if cell:
        text = text.replace("|", "\\|")
    return f"`{text}`"


def mermaid_text(value: object, limit: int = 120) -> str:
    """A Mermaid message or note text: one line, no separator, comment, arrow or fence syntax."""
    text = one_line(value, limit).replace(">=", "\u2265").replace("<=", "\u2264").translate(_MERMAID)
    while "--" in text:
        text = text.replace("--", "-\u2010")  # no arrow stem survives, even after the '>' is gone
    return text or "-"


def mermaid_alias(value: object, limit: int = 48) -> str:
    """A participant alias: letters, digits, ``_``, ``.``, ``/`` and single spaces only."""
    words = [w for w in _ALIAS.split(one_line(value, 200)) if w]
    text = " ".join(words)
    return (text[:limit].rstrip() or "unknown") if words else "unknown"


def mermaid_string(value: object, limit: int = 120) -> str:
    """A double-quoted Mermaid string (an ``xychart-beta`` title): a message text without ``"``."""
    return '"' + mermaid_text(value, limit).replace('"', "'") + '"'


def plain(value: object, limit: int = 255) -> str:
    """Untrusted text for a title: one line, no live reference (``@user``, ``#12``, ``!3``, ``~bug``, a URL, ...),
    no quick action."""
    text = _SIGIL.sub(lambda m: _FULLWIDTH[m.group()], one_line(value, limit))
    text = _SCHEME.sub(lambda m: m[1] + ":\u2215\u2215", text)
    return "\uff0f" + text[1:] if text.startswith("/") else text


def title_text(value: object, limit: int = 255) -> str:
    """An issue title: one line, at most GitLab's 255 characters."""
    return one_line(value, limit)
