"""Splitting a bill into shares of whole cents, as each build of the ``split`` service does it.

Two routes share the allocation: ``POST /split/even`` (equal shares) and ``POST /split/custom`` (weighted).

* 0.9 gives the leftover cents to the first share (correct, silent).
* 1.0 refactors to floor division and checks that the shares add up; they do not when the total is not a multiple
  of the weights' sum, and the request fails with ``RoundingError`` (500). Reachable from both routes.
* The fix distributes the leftover cents by largest remainder and reports ``split.rounded`` when it had to
  (the proof contract's must-start event). 1.1 has it on ``/split/even`` only, 1.2 and 1.4 on both.
* 1.3 has the fix on both, but a new currency table without ``CHF``: custom splits in CHF fail with ``KeyError``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Rounded = Callable[[int], None]  # called with the leftover cents the fix distributed


class RoundingError(Exception):
    """The shares do not add up to the bill."""


@dataclass(frozen=True)
class Build:
    """How one build allocates on each route: ``legacy``, ``buggy`` or ``fixed``."""

    version: str
    even: str
    custom: str
    currency_bug: bool = False


BUILDS = {
    "0.9": Build("0.9", "legacy", "legacy"),
    "1.0": Build("1.0", "buggy", "buggy"),
    "1.1": Build("1.1", "fixed", "buggy"),
    "1.2": Build("1.2", "fixed", "fixed"),
    "1.3": Build("1.3", "fixed", "fixed", currency_bug=True),
    "1.4": Build("1.4", "fixed", "fixed"),
}
DIGITS = {"EUR": 2, "USD": 2, "CHF": 2, "JPY": 0}
DIGITS_1_3 = {"EUR": 2, "USD": 2, "JPY": 0}  # 1.3's new table forgot CHF


def _floor(total: int, weights: list[int]) -> list[int]:
    whole = sum(weights)
    return [total * w // whole for w in weights]


def allocate(how: str, total: int, weights: list[int], rounded: Rounded) -> list[int]:
    """Shares of ``total`` cents in proportion to ``weights``."""
    shares = _floor(total, weights)
    leftover = total - sum(shares)
    if how == "legacy":
        shares[0] += leftover
    elif how == "fixed" and leftover:
        whole = sum(weights)
        by_remainder = sorted(range(len(weights)), key=lambda i: (-(total * weights[i] % whole), i))
        for i in by_remainder[:leftover]:
            shares[i] += 1
        rounded(leftover)
    if sum(shares) != total:
        raise RoundingError(f"shares add up to {sum(shares)} cents, not {total}")
    return shares


def split_even(build: Build, total: int, people: int, currency: str, rounded: Rounded) -> dict[str, Any]:
    """``POST /split/even``: ``people`` equal shares."""
    return {"currency": currency, "shares": allocate(build.even, total, [1] * people, rounded)}


def split_custom(build: Build, total: int, weights: list[int], currency: str, rounded: Rounded) -> dict[str, Any]:
    """``POST /split/custom``: shares in proportion to ``weights``."""
    digits = (DIGITS_1_3 if build.currency_bug else DIGITS)[currency]
    return {"currency": currency, "digits": digits, "shares": allocate(build.custom, total, weights, rounded)}
