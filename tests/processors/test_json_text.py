"""``processors.lib.json_text.one_shot``: the text of the encoder's own ``encode``, byte for byte."""

from __future__ import annotations

import enum
import json
from decimal import Decimal
from typing import Any

import pytest

from processors.lib.json_text import one_shot


class _Op(enum.StrEnum):
    READ = "read"


VALUES: list[Any] = [
    {"v": 1, "kind": "access", "access": {"op": _Op.READ, "params": (1, "x", None, 2.5, True), "where": None}},
    [["naïve ✓", "svc", 0.001, 12.345, "ok"], ['"quoted"\n', "", -0.0, 1e300, "error"]],
    {"nan": float("nan"), "inf": float("inf"), "big": 2**70, "nested": [[], {}, [()]]},
    {"decimal": Decimal("1.10"), "bytes": b"\x00"},  # what the encoder has no text for goes to ``default``
    "a string alone",
    42,
]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"default": str},
        {"separators": (",", ":"), "ensure_ascii": False, "default": str},
        {"sort_keys": True, "default": repr},
    ],
)
def test_the_text_is_the_encoders(kwargs: dict[str, Any]) -> None:
    reference = json.JSONEncoder(**kwargs)
    encode = one_shot(json.JSONEncoder(check_circular=False, **kwargs))
    for value in VALUES * 2:  # reused: the second round reads as the first
        assert encode(value) == reference.encode(value)


def test_an_encoder_without_default_still_refuses_what_it_cannot_encode() -> None:
    with pytest.raises(TypeError):
        one_shot(json.JSONEncoder(check_circular=False))({"x": object()})


def test_an_encoder_that_checks_cycles_or_indents_is_refused() -> None:
    with pytest.raises(ValueError, match="check_circular"):
        one_shot(json.JSONEncoder())
    with pytest.raises(ValueError, match="check_circular"):
        one_shot(json.JSONEncoder(check_circular=False, indent=2))
