"""Repair strategies for code on the SQLAlchemy ORM or Core (the statement is built, not written as a string)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from processors.repair.strategies.base import Context, Outcome, Writer

STRATEGIES: Final[dict[str, Callable[[Context, Writer], Outcome]]] = {}
