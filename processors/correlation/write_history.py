"""One row's (or one table scope's) recent writes, as the correlator remembers them."""

from __future__ import annotations

from collections import deque

from processors.model.events import Access
from processors.model.sizes import access_bytes


class WriteHistory(deque[Access]):
    """One entity's recent writes, oldest first, bounded (``maxlen``), with the (trace, span) of each held in a set:
    a redelivered access is found without scanning the history (a table scope's is thousands long), and their
    approximate size (``bytes``). Only ``append`` and ``popleft`` keep the set and the size: nothing else may change
    it. Each write's size is kept beside it (``sizes``), so that it leaves the history without being sized again."""

    def __init__(self, maxlen: int) -> None:
        super().__init__((), maxlen)
        self.spans: set[tuple[str, str]] = set()
        self.changed_ns = -1  # the newest commit time of a change of the row (of any row of the table, for a scope)
        self.bytes = 0
        self.sizes: deque[int] = deque()  # ``access_bytes`` of each write, in the same order

    def append(self, a: Access) -> None:
        if len(self) == self.maxlen:
            self.popleft()
        super().append(a)
        self.spans.add((a.trace_id, a.span_id))
        size = access_bytes(a)
        self.sizes.append(size)
        self.bytes += size

    def popleft(self) -> Access:
        a = super().popleft()
        self.spans.discard((a.trace_id, a.span_id))
        self.bytes -= self.sizes.popleft()
        return a
