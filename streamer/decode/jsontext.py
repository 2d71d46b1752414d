"""JSON input that is safe to pass on: parsed once, and refused when it holds text that is not Unicode.

``json.loads`` accepts a lone surrogate escape (``"\\ud800"``) and returns a ``str`` that cannot be encoded as
UTF-8; such a string fails much later (a Kafka key, a graph parameter, a log line) and far from its message. It is
refused here, with the message, as a decode error. Valid surrogate pairs decode to one code point and pass. An
integer literal longer than Python's int-string limit (4300 digits), which ``json.loads`` refuses, is kept as its
digits: a row value or an attribute Python cannot hold as an int costs no message.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from streamer.decode.errors import DecodeError

_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89a-fA-F]")


def _int_or_text(digits: str) -> int | str:
    """A JSON integer literal as an int, or as its text past Python's int-string limit (``int()`` refuses to read
    more than ``sys.get_int_max_str_digits()`` digits, and ``str()`` to write them: kept as text, the value still
    compares as a number and names the same row)."""
    try:
        return int(digits)
    except ValueError:
        return digits


def loads(data: bytes, reason: str, what: str) -> Any:
    """Parse ``data``; ``DecodeError(reason)`` for bad JSON, nesting too deep or a lone surrogate. An integer
    literal too long for an int is kept as its text (the document is parsed again for it: only then)."""
    try:
        doc = json.loads(data)
    except RecursionError as exc:
        raise DecodeError(reason, f"{what} is not valid JSON: {exc}") from exc
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors; so is an int too long
        try:
            doc = json.loads(data, parse_int=_int_or_text)
        except (ValueError, RecursionError):
            raise DecodeError(reason, f"{what} is not valid JSON: {exc}") from exc
    if _SURROGATE_ESCAPE.search(data):
        try:
            json.dumps(doc, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise DecodeError("invalid_unicode", f"{what} holds a lone surrogate: {exc.reason}") from None
    return doc
