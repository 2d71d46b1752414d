"""JSON input that is safe to pass on: parsed once, and refused when it holds text that is not Unicode.

``json.loads`` accepts a lone surrogate escape (``"\\ud800"``) and returns a ``str`` that cannot be encoded as
UTF-8; such a string fails much later (a Kafka key, a graph parameter, a log line) and far from its message. It is
refused here, with the message, as a decode error. Valid surrogate pairs decode to one code point and pass.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from streamer.decode.errors import DecodeError

_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89a-fA-F]")


def loads(data: bytes, reason: str, what: str) -> Any:
    """Parse ``data``; ``DecodeError(reason)`` for bad JSON, nesting too deep or a lone surrogate."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise DecodeError(reason, f"{what} is not valid JSON: {exc}") from exc
    if _SURROGATE_ESCAPE.search(data):
        try:
            json.dumps(doc, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise DecodeError("invalid_unicode", f"{what} holds a lone surrogate: {exc.reason}") from None
    return doc
