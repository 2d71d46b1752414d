"""Stage 1's low watermark: what an instance promises stage 2 for the spans and CDC partitions it owns, and when
the promise goes out (see :class:`~streamer.runtime.ingest.IngestStage`)."""

from __future__ import annotations

from processors.state.watermarks import Watermarks

WATERMARK_EVERY_NS = 1_000_000_000  # while nothing is sent, the low watermark goes out at most once a second
HEARTBEAT_NS = 10_000_000_000  # and at least every ten seconds


def low_watermark(watermark_ns: int, open_since: int | None, spans: Watermarks, cdc: Watermarks, now: int) -> int:
    """What an instance promises for the spans and CDC partitions it owns: every access of a trace that could
    have run before it, and every row change committed before it, is on the internal topic.

    The spans side is the watermark held back to the oldest open trace. An active CDC partition (one just
    assigned: until it delivers or is read to its end) holds it to the commits it has delivered; idle ones
    promise their idle catch-up when they are all this instance has. When everything owned is idle and never
    delivered (``--workers``: a worker whose share has no traffic), nothing older than the wall clock ``now`` can
    come: it promises the wall clock, so that it does not hold the others back and a partition it hands over in a
    rebalance stays held at that promise until its next owner reports."""
    promises = []
    if spans.holding() or spans.seen():
        promises.append(watermark_ns if open_since is None else min(watermark_ns, open_since))
    if cdc.holding() or (not promises and cdc.seen()):
        promises.append(cdc.current())
    return min(promises, default=now)


class Publication:
    """When the low watermark goes out to every internal partition: at once when the batch sent accesses or row
    changes (stage 2 can act on them), else when it moved and a second has passed since the last one (idle
    catch-up), and every ten seconds anyway (a heartbeat: this upstream is alive). Zero (a partition just assigned,
    not delivered yet) is published too: stage 2 holds for it.

    With several instances (``--workers``) each owns a share: the row changes of a table may be on one and the
    spans that wrote them on another, and stage 2's event time is the minimum over every partition's promise, so
    that it never passes commits still waiting on a partition (a worker down, a rebalance replaying). The promise
    goes out as it is now, also when it is below the last one: after a rebalance hands this instance a dead
    worker's partitions, it holds at what they replay. Stage 2 keeps each partition at the highest promise it got,
    so a lower one holds back only the partitions newly owned, at their previous owner's promise (raised to this
    instance's old promise, it would let stage 2 judge the replayed row changes before their accesses)."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last = (0, 0)  # (low watermark, wall time) last published; it may move back

    def due(self, low_ns: int, sent: bool, now: int) -> bool:
        """Whether ``low_ns`` goes out now (``sent``: the batch sent accesses or row changes); if so, it is noted
        as published at ``now``."""
        last_ns, last_wall = self.last
        if (
            not (low_ns > last_ns and (sent or now - last_wall >= WATERMARK_EVERY_NS))
            and now - last_wall < HEARTBEAT_NS
        ):
            return False
        self.last = (low_ns, now)
        return True
