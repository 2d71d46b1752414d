"""The rows a repro starts from, read off the incident's committed row changes: the columns their images name, a SQL
type for each, and every row's image before its first change."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from processors.model.outputs import CommitInfo
from processors.repro.statements import ReproError


def as_text(value: Any) -> str:
    return "" if value is None else str(value)


def image_columns(commits: Sequence[CommitInfo]) -> list[str]:
    seen: dict[str, None] = {}
    for c in commits:
        for image in (c.before, c.after):
            for column in image or {}:
                seen.setdefault(column, None)
    return list(seen)


def sql_type_of(values: Sequence[Any]) -> str:
    for v in values:
        if v is None:
            continue
        if isinstance(v, bool):
            return "boolean"
        if isinstance(v, int):
            return "bigint"
        if isinstance(v, float):
            return "double precision"
        return "text"
    return "text"


def row_key(image: dict[str, Any] | None, columns: Sequence[str]) -> tuple[str, ...] | None:
    if image is None or any(c not in image for c in columns):
        return None
    return tuple(as_text(image[c]) for c in columns)


def seed_rows(commits: Sequence[CommitInfo], columns: Sequence[str]) -> list[dict[str, Any]]:
    """Every row's image before its first change (lsn order); none for a row the incident inserted."""
    if not commits:
        raise ReproError("no committed row change to seed the row from")
    firsts: dict[tuple[str, ...] | int, CommitInfo] = {}
    for c in sorted(commits, key=lambda c: c.lsn):
        row = row_key(c.before, columns) or row_key(c.after, columns)
        firsts.setdefault(c.lsn if row is None else row, c)
    seed = []
    for first in firsts.values():
        if first.before is not None:
            seed.append(dict(first.before))
        elif first.op == "r" and first.after is not None:
            seed.append(dict(first.after))
        elif first.op != "c":
            raise ReproError("the first row change has no before-image (the table needs REPLICA IDENTITY FULL)")
    return seed
