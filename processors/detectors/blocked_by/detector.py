"""The blocked-by detector: DB statements that waited on a row lock another trace held (stage 2).

Stage 2 feeds it, per row, the accesses of closed traces and the committed row changes credited to the traces that
made them (``processors.correlation.engine``). A row keeps its recent lock-taking statements (writes, and reads ``FOR
UPDATE``/``FOR SHARE``: what takes a row lock in PostgreSQL) and its credited commits. A lock-taking statement S of
trace B that lasted at least ``min_wait_ms`` is judged once event time has passed its end by ``settle_ns`` (the
entities stage holds event time back until the row changes before it are credited, so the commit that released it
is known by then): B was blocked by trace A when

- A's commit of the row (Debezium's commit time, millisecond resolution, with the database's clock within
  ``skew_ns`` of the application's: the tolerance ``correlation.skew_ms`` stands for) can lie after S started and
  no later than S's end, and S ended no more than ``release_ns`` after it could have been: S returned when A's
  commit released the row;
- A had taken the row before S started: a lock-taking statement of A on the row (one that conflicts with S: two
  ``FOR SHARE`` reads do not) started before S and ended before that commit, after A's previous commit of the row.

The wait is the part of S before A's commit; the hold runs from A's first lock-taking statement on the row to its
commit; the share of the hold A spent outside its own DB statements (any row, from ``max_traces`` recent traces)
tells which remedy the evidence supports (``model.remedy_for``). Lock waits are aggregated per (blocked, blocking)
pair of code paths and event-time window (``window_ns``, by the waiting statement's end); a window whose pair waited
``min_blocked`` times or more becomes a finding when event time passes its end plus the settle time.

A row change that comes after the statements it could have released were judged (Debezium lagging behind the
settle time) has them judged again at once (``late_commits``); a lock wait found for a window already emitted is
counted (``late_blocks``), not published twice under one occurrence. Commits not credited to a trace name no holder
(``uncredited_commits``): never guessed.

State, all bounded and counted: rows (``max_entities``, each ``history_per_entity`` deep), long statements waiting
to be judged (``max_entities``), statement times per trace (``max_traces``), open (pair, window) aggregates
(``max_pairs``) and the blocked statements already counted (``max_traces``, so that a replay counts nothing twice).
A row's input is held per quarter second of event time (``blocked_inputs``: one slot per row and quarter second, up
to four times ``max_entities``): a slot's input is released once every statement its events bear on is judged (its
newest event plus the release tolerance, past the settle time), so a row written without rest holds its last
seconds only, never its whole history; a row with a lock wait in an open window holds until that window is
emitted (a restart replays it). The history stays, unpinned, for late row changes until it is older than
``max_hold_ns``: a holder's statement whose commit comes after a restart past it is not recovered.

Rebalances: a row remembers the input partition that fed it last; when that partition goes to another instance
(``on_revoke``), the row goes from here with everything it holds, its lock waits in open windows included.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass

from processors.api.component import Emit, Processor, Quarantined
from processors.api.provenance import NO_EVENTS, StateEvents
from processors.api.telemetry import Telemetry
from processors.detectors.blocked_by.aggregate import PairWindow, finding, pair_fingerprint, pair_key
from processors.detectors.blocked_by.model import Block, fingerprint
from processors.model.events import Access, Commit, DbOperation, LockMode
from processors.model.units import MS_NS
from processors.state.keyed import Deadlines, KeyedState
from processors.state.lru import CountedLRU

SLOT_NS = 250 * MS_NS  # the event time one input slot of a row covers
WRITES = frozenset({DbOperation.WRITE, DbOperation.INSERT, DbOperation.DELETE})
LOCKING_READS = frozenset({LockMode.FOR_UPDATE, LockMode.FOR_SHARE})


def takes_lock(access: Access) -> bool:
    """Whether the statement takes a lock on one known row: a write, or a locking read, of a row named by its key."""
    return access.keyed and access.key_candidates == 1 and (access.operation in WRITES or access.lock in LOCKING_READS)


def conflicts(waiting: Access, holding: Access) -> bool:
    """Whether ``holding``'s row lock makes ``waiting`` wait: any pair but two share-locking reads."""
    shared = {a.operation is DbOperation.READ and a.lock is LockMode.FOR_SHARE for a in (waiting, holding)}
    return shared != {True}


def covered(intervals: list[tuple[int, int]], start: int, end: int) -> int:
    """How much of ``[start, end]`` the union of ``intervals`` covers."""
    total, reach = 0, start
    for lo, hi in sorted(intervals):
        lo, hi = max(lo, reach), min(hi, end)
        if hi > lo:
            total += hi - lo
            reach = hi
    return total


@dataclass(slots=True)
class RowLocks:
    """One row's recent lock-taking statements and credited commits."""

    accesses: deque[Access]
    commits: deque[Commit]
    newest_ns: int = 0
    released: bool = False
    holding_until_ns: int = 0  # a lock wait on the row is in a window not emitted before this
    part: str = ""  # the input partition that fed it last


class BlockedByDetector(Processor):
    """Per-row lock histories judged on the watermark; see the module docstring."""

    name = "blocked_by"

    def __init__(
        self,
        *,
        min_wait_ns: int,
        release_ns: int,
        skew_ns: int,
        window_ns: int,
        settle_ns: int,
        max_hold_ns: int,
        min_blocked: int = 2,
        history_per_entity: int = 64,
        max_entities: int = 100_000,
        max_traces: int = 100_000,
        max_pairs: int = 10_000,
        telemetry: Telemetry | None = None,
        events: StateEvents = NO_EVENTS,
    ) -> None:
        self.min_wait_ns, self.release_ns, self.skew_ns = min_wait_ns, release_ns, skew_ns
        self.window_ns, self.settle_ns, self.max_hold_ns = window_ns, settle_ns, max_hold_ns
        self.min_blocked, self.history, self.max_pairs = min_blocked, history_per_entity, max_pairs
        self.max_due = max_entities  # long statements waiting to be judged
        self.telemetry = (telemetry or Telemetry("blocked_by")).declare("history_per_entity", "max_pairs", "max_due")
        self._rows: KeyedState[str, RowLocks] = KeyedState(
            "blocked_rows",
            bound=max_entities,
            new=self._new_row,
            telemetry=self.telemetry,
            events=NO_EVENTS,  # a row's history pins nothing: its (row, second) input slots do
            on_evict=lambda key, _state: self._tidy.cancel(key),
            reason="max_entities",
        )
        self._tidy: Deadlines[str] = Deadlines()  # when a row's history is pruned
        # The input of each (row, second of event time), released once what it bears on is judged (module docstring).
        self._inputs: KeyedState[tuple[str, int], int] = KeyedState(
            "blocked_inputs", bound=4 * max_entities, new=lambda _key: 0, telemetry=self.telemetry, events=events,
            reason="max_pinned_inputs",
        )  # fmt: skip
        self._input_due: Deadlines[tuple[str, int]] = Deadlines()
        self._due: list[tuple[int, int, Access]] = []  # long lock-taking statements by end time, to be judged
        self._seq = itertools.count()
        self._times: CountedLRU[str, dict[str, tuple[int, int]]] = CountedLRU(max_traces, self.telemetry, "max_traces")
        self._judged: CountedLRU[str, None] = CountedLRU(max_traces, self.telemetry, "max_judged")
        self._windows: dict[tuple[str, int], PairWindow] = {}
        self._judged_until_ns = 0  # statements that ended before this are judged
        self._emitted_until_ns = 0  # windows that ended before this are emitted

    def _new_row(self, _key: str) -> RowLocks:
        return RowLocks(deque(maxlen=self.history), deque(maxlen=self.history))

    @property
    def counters(self) -> dict[str, int]:
        return self.telemetry.events

    # ---- Processor hooks ----------------------------------------------------------------------------------------

    def on_access(self, access: Access, part: str = "") -> None:
        spans = self._times.get(access.trace_id)
        if spans is None:
            self._times.put(access.trace_id, {access.span_id: (access.start_ns, access.end_ns)})
        else:
            spans[access.span_id] = (access.start_ns, access.end_ns)
        if not takes_lock(access):
            return
        state = self._rows.retain(access.entity)
        state.part = part
        if any(a.span_id == access.span_id and a.trace_id == access.trace_id for a in state.accesses):
            self.telemetry.count("redelivered")
            return
        if len(state.accesses) == state.accesses.maxlen:
            self.telemetry.drop("history_per_entity")
        state.accesses.append(access)
        self.telemetry.count("lock_accesses")
        self._touch(access.entity, state, access.end_ns)
        if access.end_ns - access.start_ns >= self.min_wait_ns:
            self.telemetry.count("long_statements")
            if len(self._due) >= self.max_due:
                self.telemetry.drop("max_due")  # more long statements waiting to be judged than rows: not judged
                return
            heapq.heappush(self._due, (access.end_ns, next(self._seq), access))

    def on_commit(self, entity: str, commit: Commit, part: str = "") -> None:
        if not commit.trace_id:
            self.telemetry.count("uncredited_commits")  # no holder can be named: never guessed
            return
        state = self._rows.retain(entity)
        state.part = part
        if any(c.change.lsn == commit.change.lsn for c in state.commits):
            self.telemetry.count("redelivered")
            return
        if len(state.commits) == state.commits.maxlen:
            self.telemetry.drop("history_per_entity")
        state.commits.append(commit)
        self.telemetry.count("commits")
        at = commit.change.commit_ts_ms * MS_NS
        self._touch(entity, state, at)
        if at - self.skew_ns - self.release_ns <= self._judged_until_ns:  # statements it may have released: judged
            self.telemetry.count("late_commits")
            for access in list(state.accesses):
                if access.end_ns <= self._judged_until_ns and access.end_ns - access.start_ns >= self.min_wait_ns:
                    self._judge(access)

    def on_revoke(self, part: str) -> None:
        """Input partition ``part`` went to another instance: the rows it fed go from here, with their statements
        not judged yet, the input they held and their lock waits in open windows. The new owner replays that input
        and counts them; counted here as well, one window's waits would be counted by two instances."""
        gone = {key for key, state in self._rows.items() if state.part == part}
        if not gone:
            return
        for key in gone:
            self._tidy.cancel(key)
            self._rows.discard(key)
        for slot in [slot for slot in self._inputs if slot[0] in gone]:
            self._input_due.cancel(slot)
            self._inputs.discard(slot)
        self._due = [due for due in self._due if due[2].entity not in gone]
        heapq.heapify(self._due)
        for window, pair in list(self._windows.items()):
            pair.forget(gone)
            if pair.count <= 0 or not pair.blocks:  # nothing left here to show (or to count)
                del self._windows[window]
        self.telemetry.count("revoked_rows", len(gone))

    def on_watermark(self, watermark_ns: int, open_since_ns: int | None, out: Emit) -> None:
        until = watermark_ns - self.settle_ns
        while self._due and self._due[0][0] <= until:
            _, _, access = heapq.heappop(self._due)
            try:
                self._judge(access)
            except Exception as exc:  # one statement that cannot be judged: its row goes, the others are judged
                slots = [slot for slot in self._inputs if slot[0] == access.entity]
                held = tuple(("blocked_inputs", slot) for slot in slots)
                out.quarantined.append(Quarantined(f"statement {access.span_id} on {access.entity}", exc, held))
                for slot in slots:
                    self._input_due.cancel(slot)
                    self._inputs.discard(slot)
                self._tidy.cancel(access.entity)
                self._rows.discard(access.entity)
        self._judged_until_ns = max(self._judged_until_ns, until)
        self._emit(until, watermark_ns, out)
        for key in self._tidy.due(until):
            state = self._rows.get(key)
            if state is not None:
                self._tidy_row(key, state, until)
        for slot in self._input_due.due(until):
            row = self._rows.get(slot[0])
            if row is not None and row.holding_until_ns > until:
                self._input_due.set(slot, row.holding_until_ns)  # a lock wait in an open window: replayed if lost
            else:
                self._inputs.discard(slot)
        horizon = until - self.max_hold_ns - self.release_ns - self.skew_ns
        while (oldest := self._times.oldest()) is not None and max(e for _, e in oldest[1].values()) < horizon:
            self._times.pop(oldest[0])  # (oldest first, nearly: a trace's statements come together when it closes)
        self.telemetry.gauge("rows", len(self._rows))
        self.telemetry.gauge("pinned_inputs", len(self._inputs))
        self.telemetry.gauge("open_pairs", len(self._windows))

    # ---- judging ------------------------------------------------------------------------------------------------

    def _touch(self, key: str, state: RowLocks, event_ns: int) -> None:
        """The input being processed is held by its (row, second) slot until what that second bears on is judged;
        the row's history is looked at again once its newest event is."""
        state.newest_ns = max(state.newest_ns, event_ns)
        state.released = False
        self._tidy.set(key, state.newest_ns + MS_NS + self.skew_ns + self.release_ns)
        slot = (key, event_ns // SLOT_NS)
        self._inputs.put(slot, slot[1])
        self._input_due.extend(slot, event_ns + MS_NS + self.skew_ns + self.release_ns)  # its newest event judged

    def _window_of(self, at_ns: int) -> int:
        return at_ns - at_ns % self.window_ns

    def _judge(self, waiting: Access) -> None:
        """Whether ``waiting`` waited on another trace's lock (see the module docstring); a lock wait found is
        added to its pair's window."""
        if waiting.span_id in self._judged:
            return
        state = self._rows.get(waiting.entity)
        if state is None:
            return
        block = self._block(waiting, state)
        if block is None:
            return
        self._judged.add(waiting.span_id)
        self.telemetry.count("blocks")
        start = self._window_of(waiting.end_ns)
        if start + self.window_ns <= self._emitted_until_ns:
            self.telemetry.count("late_blocks")  # its window is out: not published twice under one occurrence
            return
        fp = pair_fingerprint(block)
        pair = self._windows.get((fp, start))
        if pair is None:
            if len(self._windows) >= self.max_pairs:
                self.telemetry.drop("max_pairs")
                return
            pair = self._windows[fp, start] = PairWindow(fp, start, start + self.window_ns)
        pair.add(block)
        state.holding_until_ns = max(state.holding_until_ns, start + self.window_ns)

    def _block(self, s: Access, state: RowLocks) -> Block | None:
        """The lock wait of ``s``: the latest credited commit of another trace that can have released it, with its
        holder's first lock-taking statement before ``s`` started; None when there is none."""
        found: Block | None = None
        for c in state.commits:
            if c.trace_id == s.trace_id:
                continue
            at = c.change.commit_ts_ms * MS_NS
            lo, hi = at - self.skew_ns, at + MS_NS - 1 + self.skew_ns  # where the commit can be on the app's clock
            if not (s.start_ns < hi and lo <= s.end_ns <= hi + self.release_ns):
                continue
            before = max(
                (
                    p.change.commit_ts_ms * MS_NS
                    for p in state.commits
                    if p.trace_id == c.trace_id and p.change.commit_ts_ms < c.change.commit_ts_ms
                ),
                default=None,
            )
            held = [
                h
                for h in state.accesses
                if h.trace_id == c.trace_id
                and h.start_ns < s.start_ns
                and h.end_ns <= hi
                and (before is None or h.start_ns > before)
                and conflicts(s, h)
            ]
            if not held:
                continue
            holder = min(held, key=lambda h: h.start_ns)
            wait = min(s.end_ns, max(s.start_ns, at)) - s.start_ns
            if wait < self.min_wait_ns:
                continue
            hold = max(at - holder.start_ns, 0)
            spans = list((self._times.peek(c.trace_id) or {}).values())
            inside = covered(spans, holder.start_ns, at) if hold else 0
            block = Block(s.entity, s, holder, c, wait, hold, 1 - inside / hold if hold else 0.0)
            if found is None or at > found.commit.change.commit_ts_ms * MS_NS:
                found = block
        return found

    # ---- emitting and pruning -----------------------------------------------------------------------------------

    def _emit(self, until_ns: int, watermark_ns: int, out: Emit) -> None:
        """Every window that ended by ``until_ns``: a pair that waited ``min_blocked`` times is a finding."""
        closing = [key for key in self._windows if key[1] + self.window_ns <= until_ns]
        keys = {(fingerprint(*pair_key(p.blocks[0])), key[1]) for key in closing if (p := self._windows[key]).blocks}
        for key in closing:
            pair = self._windows[key]
            if pair.count < self.min_blocked:
                self.telemetry.count("below_min_blocked")
                continue
            try:
                service, path, holder_service, holder_path, table = pair_key(pair.blocks[0])
                reverse = (fingerprint(holder_service, holder_path, service, path, table), key[1])
                out.events.append(finding(pair, both_ways=reverse in keys, detected_ns=watermark_ns))
                self.telemetry.count("findings")
            except Exception as exc:  # one window that cannot be rendered: the others go out
                out.quarantined.append(Quarantined(f"blocked_by window {key}", exc))
        for key in closing:
            del self._windows[key]
        self._emitted_until_ns = max(self._emitted_until_ns, self._window_of(until_ns))

    def _tidy_row(self, key: str, state: RowLocks, until_ns: int) -> None:
        """Every statement the row's events bear on is judged: its input is released, unless a lock wait on it is in
        a window not emitted yet (then when that window is); history older than the longest hold looked for is
        pruned (kept unpinned for late row changes until then), and the row goes when nothing is left."""
        if state.holding_until_ns > until_ns:
            self._tidy.set(key, state.holding_until_ns)
            return
        if not state.released:
            self._rows.release(key)
            state.released = True
        horizon = until_ns - self.max_hold_ns - self.release_ns - self.skew_ns
        while state.accesses and state.accesses[0].end_ns < horizon:
            state.accesses.popleft()
        while state.commits and state.commits[0].change.commit_ts_ms * MS_NS < horizon:
            state.commits.popleft()
        if not state.accesses and not state.commits:
            self._rows.discard(key)
            return
        self._tidy.set(key, state.newest_ns + self.max_hold_ns + self.release_ns + self.skew_ns + MS_NS)
