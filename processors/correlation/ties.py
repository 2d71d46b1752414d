"""Bookkeeping of row changes tied among their writers (``processors.correlation.engine``): which change is which
however
often it is delivered, which writers made another change already, and the groups of tied changes that share writers."""

from __future__ import annotations

from processors.model.events import Access, RowChange
from processors.state.lru import CountedLRU

ChangeId = tuple[str, int, int]  # (row, lsn, commit time): one committed change, however often it is delivered


def change_id(change: RowChange) -> ChangeId:
    return (change.entity_key, change.lsn, change.commit_ts_ms)


def components(tied: list[tuple[int, list[Access]]]) -> list[list[tuple[int, list[Access]]]]:
    """Tied changes in the groups that share no candidate writer, each in commit order: resolved on their own."""
    groups: list[tuple[set[tuple[str, str]], list[tuple[int, list[Access]]]]] = []
    for entry in tied:
        ids = {(a.trace_id, a.span_id) for a in entry[1]}
        joined = [g for g in groups if g[0] & ids]
        groups = [g for g in groups if not g[0] & ids]
        groups.append((ids.union(*(g[0] for g in joined)), [e for g in joined for e in g[1]] + [entry]))
    return [sorted(members, key=lambda e: e[0]) for _, members in groups]


class MadeAnother:
    """The accesses (trace id, span id) that made a change other than ``change``: a replayed change is not kept
    from the writer it was credited to the first time."""

    __slots__ = ("_change", "_credited")

    def __init__(self, credited: CountedLRU[tuple[str, str], ChangeId], change: RowChange) -> None:
        self._credited, self._change = credited, change_id(change)

    def __contains__(self, key: object) -> bool:
        made = self._credited.peek(key)  # type: ignore[arg-type]
        return made is not None and made != self._change


def unmade(accesses: list[Access], made: MadeAnother) -> list[Access]:
    return [a for a in accesses if (a.trace_id, a.span_id) not in made]
