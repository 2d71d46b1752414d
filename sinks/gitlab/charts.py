"""Numbers of GitLab's Mermaid ``xychart-beta`` charts: values as Mermaid reads them, and a round top for the y axis.

Shared by the regression body (bars before and after) and the generic finding body (each ``Series`` as a line).
"""

from __future__ import annotations

import math


def number(value: float) -> str:
    """A Mermaid number: plain decimal notation (no exponent), at most three decimals."""
    if not math.isfinite(value):
        return "0"
    return f"{value:.3f}".rstrip("0").rstrip(".") or "0"


def ceiling(top: float) -> float:
    """A round upper end of the y axis, at least 10% above the highest bar as shown (1 when every bar shows 0)."""
    if not math.isfinite(top) or top <= 0:
        return 1.0
    want = top * 1.1
    scale = 10.0 ** math.floor(math.log10(want))
    return next(step * scale for step in (1.0, 2.0, 2.5, 5.0, 10.0) if step * scale >= want)


__all__ = ["ceiling", "number"]
