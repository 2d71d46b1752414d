"""JSON text from json's C encoder made once per encoder, not once per value.

``json.JSONEncoder.encode`` makes a new C encoder at every call, with a dict for its check of circular references:
for the small values stage 1 encodes by the thousand (an access for the internal topic, a trace's omitted spans)
that set-up is a large share of the cost. :func:`one_shot` makes it once; the text is ``encode``'s, byte for byte.
"""

from __future__ import annotations

import json
import json.encoder
from collections.abc import Callable
from typing import Any

_C_MAKE_ENCODER: Any = getattr(json.encoder, "c_make_encoder", None)  # None where json's C accelerator is missing


def one_shot(encoder: json.JSONEncoder) -> Callable[[Any], str]:
    """``encoder.encode``, reusing one C encoder. The encoder must not check for circular references (its values
    hold none: the check's dict is what one made per call avoids) nor indent (json's C encoder does not)."""
    if encoder.check_circular or getattr(encoder, "indent", None) is not None:  # (typeshed: never None)
        raise ValueError("one_shot needs an encoder with check_circular=False and no indent")
    if _C_MAKE_ENCODER is None:
        return encoder.encode
    strings = json.encoder.encode_basestring_ascii if encoder.ensure_ascii else json.encoder.encode_basestring
    try:  # the arguments ``JSONEncoder.iterencode`` gives it (CPython's private API: on a change, ``encode`` itself)
        chunks = _C_MAKE_ENCODER(
            None,
            encoder.default,
            strings,
            None,
            encoder.key_separator,
            encoder.item_separator,
            encoder.sort_keys,
            encoder.skipkeys,
            encoder.allow_nan,
        )
    except TypeError:
        return encoder.encode

    def encode(value: Any) -> str:
        return "".join(chunks(value, 0))

    return encode
