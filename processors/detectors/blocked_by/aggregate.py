"""Lock waits aggregated per (blocked, blocking) pair and event-time window, and the finding each one becomes."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from processors.detectors.blocked_by.model import (
    BLOCKED_BY,
    Block,
    BlockedByData,
    LockWait,
    code_path,
    fingerprint,
    remedy_for,
)
from processors.model.finding import ContractRules, FindingEvent, Point, Series, Subject
from processors.model.units import ns_to_ms

MAX_POINTS = 500  # a chart's points (``Series``)
MAX_EXAMPLES = 5


@dataclass(slots=True)
class PairWindow:
    """The lock waits of one (blocked, blocking) pair in one window."""

    fingerprint: str
    window_start_ns: int
    window_end_ns: int
    blocks: list[Block] = field(default_factory=list)
    rows: dict[str, tuple[int, int]] = field(default_factory=dict)  # row -> its lock waits here: count, wait
    total_wait_ns: int = 0
    count: int = 0

    def add(self, block: Block) -> None:
        self.count += 1
        self.total_wait_ns += block.wait_ns
        n, wait = self.rows.get(block.row, (0, 0))
        self.rows[block.row] = (n + 1, wait + block.wait_ns)
        if len(self.blocks) < MAX_POINTS:
            self.blocks.append(block)

    def forget(self, rows: set[str]) -> None:
        """Take out the lock waits on ``rows`` (their partition went to another instance, which counts them)."""
        for row in rows & self.rows.keys():
            n, wait = self.rows.pop(row)
            self.count -= n
            self.total_wait_ns -= wait
        self.blocks = [b for b in self.blocks if b.row not in rows]


def pair_key(block: Block) -> tuple[str, str, str, str, str]:
    """(blocked service, blocked path, blocking service, blocking path, table) of a lock wait."""
    s, h = block.blocked, block.holder
    return s.service, code_path(s), h.service, code_path(h), s.table


def pair_fingerprint(block: Block) -> str:
    return fingerprint(*pair_key(block))


def finding(pair: PairWindow, *, both_ways: bool, detected_ns: int) -> FindingEvent:
    """The finding of one pair's window (its ``occurrence``: the fingerprint and the window's start)."""
    blocks = pair.blocks
    first, last = blocks[0], max(blocks, key=lambda b: b.blocked.end_ns)
    service, blocked_path, blocking_service, blocking_path, table = pair_key(first)
    waits = [ns_to_ms(b.wait_ns) for b in blocks]
    holds = [ns_to_ms(b.hold_ns) for b in blocks]
    outside = statistics.median(b.outside_db_share for b in blocks)
    remedy = remedy_for(outside, both_ways)
    blocked_routes = sorted({b.blocked.route for b in blocks if b.blocked.route})
    blocking_routes = sorted({b.holder.route for b in blocks if b.holder.route})
    data = BlockedByData(
        table=table,
        blocked_service=service,
        blocked_path=blocked_path,
        blocked_routes=blocked_routes,
        blocking_service=blocking_service,
        blocking_path=blocking_path,
        blocking_routes=blocking_routes,
        window_start_unix_ms=ns_to_ms(pair.window_start_ns),
        window_end_unix_ms=ns_to_ms(pair.window_end_ns),
        blocked=pair.count,
        rows=len(pair.rows),
        total_wait_ms=round(ns_to_ms(pair.total_wait_ns), 3),
        max_wait_ms=round(max(waits), 3),
        median_wait_ms=round(statistics.median(waits), 3),
        max_hold_ms=round(max(holds), 3),
        median_hold_ms=round(statistics.median(holds), 3),
        holder_outside_db_share=round(outside, 3),
        both_ways=both_ways,
        examples=[
            LockWait(
                row=b.row,
                blocked_trace=b.blocked.trace_id,
                blocked_span=b.blocked.span_id,
                blocking_trace=b.holder.trace_id,
                blocking_span=b.holder.span_id,
                commit_lsn=b.commit.change.lsn,
                wait_ms=round(ns_to_ms(b.wait_ns), 3),
                hold_ms=round(ns_to_ms(b.hold_ns), 3),
            )
            for b in sorted(blocks, key=lambda b: -b.wait_ns)[:MAX_EXAMPLES]
        ],
    )
    evidence = [
        f"{pair.count} statement(s) of {blocked_path} ({service}) waited on a row lock of {table} held by "
        f"{blocking_path} ({blocking_service}): {data.total_wait_ms:.0f} ms in total, at most "
        f"{data.max_wait_ms:.0f} ms (median {data.median_wait_ms:.0f} ms), on {data.rows} row(s)",
        f"the holder kept the lock {data.median_hold_ms:.0f} ms (median; at most {data.max_hold_ms:.0f} ms), from its "
        f"first lock-taking statement to its commit; {outside:.0%} of that time outside its own DB statements",
        "each waiting statement started while the holder held the row and returned when the holder's commit "
        "(Debezium's commit time, within the clock skew) released it",
    ]
    if both_ways:
        evidence.append(
            f"{blocking_path} also waited on {blocked_path} in this window: the paths lock in opposite orders"
        )
    example = data.examples[0]
    evidence.append(
        f"e.g. trace {example.blocked_trace} waited {example.wait_ms:.0f} ms on {example.row} for trace "
        f"{example.blocking_trace} (commit lsn {example.commit_lsn})"
    )
    fp = pair.fingerprint
    return FindingEvent(
        fingerprint=fp,
        occurrence=f"{fp}:{int(ns_to_ms(pair.window_start_ns))}",
        detected_at_unix_ms=ns_to_ms(detected_ns),
        type=BLOCKED_BY.name,
        title=f"{blocked_path} waits on {blocking_path}'s row lock on {table}",
        subject=Subject(
            service=service,
            operation=blocked_routes[0] if blocked_routes else blocked_path,
            entity=table,
            version=last.blocked.version,
        ),
        severity=BLOCKED_BY.severity,
        remedy=remedy,
        affected=len({b.blocked.trace_id for b in blocks}),  # the requests that waited
        evidence=evidence,
        data=data.model_dump(mode="json"),
        series=[
            Series(
                name="lock waits",
                x_label="time (Unix ms)",
                y_label="wait (ms)",
                points=[Point(x=ns_to_ms(b.blocked.end_ns), y=round(ns_to_ms(b.wait_ns), 3)) for b in blocks],
            ),
            Series(
                name="lock holds",
                x_label="time (Unix ms)",
                y_label="hold (ms)",
                points=[Point(x=ns_to_ms(b.holder.start_ns), y=round(ns_to_ms(b.hold_ns), 3)) for b in blocks],
            ),
        ],
        traces=list(dict.fromkeys(b.blocked.trace_id for b in blocks))[:20],
        first_seen_unix_ms=ns_to_ms(min(b.blocked.start_ns for b in blocks)),
        last_seen_unix_ms=ns_to_ms(last.blocked.end_ns),
        contract=ContractRules(signature=f"finding:blocked_by:{fp}", service=service, routes=blocked_routes),
    )
