"""The collision detector: independent traces that touched the same row inside the causal window.

Stage 2 feeds it, per entity, the accesses of closed traces (reads and writes with their lock modes) and the
committed row changes credited to them. Judging is incremental, so that a busy row is judged as the watermark
passes its history, not only once it falls quiet: an entity is due one causal window plus the settle time after
its oldest event not judged yet; then every pair of traces whose accesses there all ended by ``watermark - window
- settle`` and that was not judged before is judged (:class:`~processors.detectors.collisions.classify.PairJudge`),
and each new collision becomes an incident.

Input can come after its row was judged past it: Debezium lagging more than the settle time behind the spans, or
the rest of a trace that stage 1 closed in two fragments. Such input re-opens the pairs it bears on (a late row
change: its trace's, or every writer's in the window before it when it is not credited; more of a trace: that
trace's), counted as ``late_commits`` and ``late_accesses``, and they are judged again while the row's history
lasts: two windows past its judging, or, for a row (a scope) with a write that no change of it (of its table) has
followed yet, until that change comes or ``late_ns`` (``windows.max_cdc_lag_s``) has passed since the write
(``held_for_changes``; only rows of tables Debezium has sent a change of): Debezium's lag costs memory only while
it lasts. Later than that, input is counted as ``late_past_history``. A pair is reported once, under whichever class
it was first found (``Collision.pair``): a lost update first judged without its row changes stays latent.

Predicate statements (no row named by its key) arrive keyed by their table's scope (``table:*``) and are kept in a
history of their own; a row's judging looks there for the predicates that selected one of its images or that its
changes moved (phantoms). A scope's input is held one window longer than a row's, since every row it can pair with
is judged within two windows of it.

State, all bounded and counted: per-entity histories (``max_entities`` rows and scopes, each
``history_per_entity`` deep), every recent trace's accesses and credited commits for the classes that span rows
(``max_traces``; a trace on a row waiting for a change stays while it waits), the pairs already reported
(``max_reported``; so that a pair is reported once) and the input behind what is not judged yet, one key per (row,
trace) and per (row, commit) (``max_entities`` keys): a row's input is released as soon as it has been judged, so
the pins of a busy row stay within one judging horizon. History stays for later pairs until it falls out of
``2 x window`` (a row waiting for a change: see above).

Containment: each due row is judged on its own. A row whose judging raises (a value no invariant can compare, a
bug) is quarantined: its history goes, the input it held is released, and it is reported in ``Emit.quarantined``
(the runtime counts it and logs the input offsets it came from); the incidents found before it, in it and after it
in the same step are emitted all the same, and every other due row is judged and released.

Rebalances: a row remembers the internal partition that fed it last. When that partition goes to another instance
(``on_revoke``), the row goes from here with the input it held: the new owner replays what was not judged and
judges it. Judged here too, its pairs would be reported by both instances, which see the same watermarks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from processors.api.component import Emit, Processor, Quarantined
from processors.api.provenance import NO_EVENTS, StateEvents
from processors.api.telemetry import Telemetry
from processors.correlation.keying import inferred, undecided
from processors.detectors.collisions.classify import PairJudge
from processors.detectors.collisions.incident import incident_event
from processors.detectors.collisions.views import WRITES, Collision, EntityHistory, Memory, commit_ns
from processors.lib.invariants import Invariant
from processors.model.events import Access, Commit, change_followed, scope_key
from processors.model.units import MS_NS
from processors.state.keyed import Deadlines, KeyedState
from processors.state.lru import CountedLRU

_NEVER = 1 << 62  # a pruning horizon no event time reaches


class CollisionDetector(Processor):
    """Per-entity bounded histories judged on the watermark; see the module docstring."""

    name = "collisions"

    def __init__(
        self,
        *,
        window_ns: int,
        settle_ns: int,
        late_ns: int = 0,
        invariants: Mapping[str, list[Invariant]] | None = None,
        history_per_entity: int = 256,
        history_per_table: int = 4096,
        max_entities: int = 100_000,
        max_traces: int = 200_000,
        max_reported: int = 100_000,
        skew_ns: int = 5 * MS_NS,
        telemetry: Telemetry | None = None,
        events: StateEvents = NO_EVENTS,
    ) -> None:
        self.window_ns = window_ns
        self.settle_ns = settle_ns
        self.late_ns = late_ns
        self.skew_ns = skew_ns
        self.history = history_per_entity
        self.history_per_table = history_per_table
        self.telemetry = (telemetry or Telemetry("collisions")).declare("history_per_entity", "history_per_table")
        self.judge = PairJudge(window_ns, invariants, skew_ns, self.telemetry)
        self._entities: KeyedState[str, EntityHistory] = KeyedState(
            "entities", bound=max_entities, new=self._new_entity, telemetry=self.telemetry,
            on_evict=self._evicted, reason="max_entities",
        )  # fmt: skip
        # The input behind what is not judged yet: (row, trace id) and (row, "@lsn") -> its event time.
        self._inputs: KeyedState[tuple[str, str], int] = KeyedState(
            "entity_inputs", bound=max_entities, new=lambda _key: 0, telemetry=self.telemetry, events=events,
            reason="max_pinned_inputs", on_evict=self._input_evicted,
        )  # fmt: skip
        self._deadlines: Deadlines[str] = Deadlines()
        self._by_trace: CountedLRU[str, list[Access]] = CountedLRU(max_traces, self.telemetry, "max_traces")
        self._commits: CountedLRU[str, list[tuple[str, Commit]]] = CountedLRU(max_traces, self.telemetry,
                                                                              "max_traces")  # fmt: skip
        self.memory = Memory(self._by_trace, self._commits, self._entities.get)
        self._reported: CountedLRU[str, None] = CountedLRU(max_reported, self.telemetry, "max_reported")
        self._pruned_ns = 0  # history older than this has been pruned
        # Traces on a row waiting for a late change -> until when (``_forget_traces`` keeps them that long).
        self._held_traces: CountedLRU[str, int] = CountedLRU(max_traces, self.telemetry, "max_traces")
        # (before, until): while the pruning horizons stay at or below these, no trace can be forgotten (every
        # old one is held): ``_forget_traces`` does not walk them again. A new trace or hold lowers them; a
        # statement taken out of a trace (``_supersede``) unsets them.
        self._quiet: tuple[int, int] | None = None
        # Tables Debezium has sent a change of: only their rows can wait for one (``_awaiting_change``).
        self._captured: CountedLRU[str, None] = CountedLRU(max_entities, self.telemetry, "max_entities")

    def __len__(self) -> int:
        return len(self._entities)

    @property
    def counters(self) -> dict[str, int]:
        return self.telemetry.events

    def _new_entity(self, key: str) -> EntityHistory:
        depth = self.history_per_table if key.endswith(":*") else self.history
        return EntityHistory(deque(maxlen=depth), deque(maxlen=self.history))

    def _evicted(self, key: str, state: EntityHistory) -> None:
        self._deadlines.cancel(key)
        for slot in state.inputs:
            self._inputs.discard(slot)

    def _input_evicted(self, key: tuple[str, str], _at: int) -> None:
        """The bound of pinned inputs let ``key`` go: its entity no longer holds it."""
        state = self._entities.get(key[0])
        if state is not None:
            state.inputs.discard(key)

    def _hold(self, entity: str, state: EntityHistory, slot: str, event_ns: int) -> None:
        """The input being processed is needed until the row is judged past ``event_ns``."""
        key = (entity, slot)
        at = max(self._inputs.get(key) or 0, event_ns)
        self._inputs.put(key, at)
        state.inputs.hold(key, at)

    # ---- Processor hooks ----------------------------------------------------------------------------------------

    def on_access(self, access: Access, part: str = "") -> None:
        """Add an access to its entity's history (the input being processed is held until the entity is judged)."""
        if access.error and access.operation in WRITES:
            self.telemetry.count("failed_writes")
            return  # a statement that failed wrote nothing: nothing to keep, no input to hold
        self._past_history(access.entity, access.end_ns)
        if inferred(access):
            self._supersede(access)
        state = self._entities.retain(access.entity)
        state.part = part or state.part
        if access.trace_id in state.judged:  # more of a trace already judged here (a fragment): judged again
            if any(a.span_id == access.span_id for a in state.accesses):
                self.telemetry.count("redelivered")  # a replay of what was judged: nothing new to judge
                return
            state.judged.discard(access.trace_id)
            self.telemetry.count("late_accesses")
        self._hold(access.entity, state, access.trace_id, access.end_ns)
        if len(state.accesses) == state.accesses.maxlen:
            self.telemetry.drop("history_per_entity" if access.keyed else "history_per_table")
        state.accesses.append(access)
        self.telemetry.count("accesses")
        self._touch(access.entity, state, access.end_ns)
        trace = self._by_trace.get(access.trace_id)
        if trace is None:
            if self._quiet is not None:  # a new trace: old from its end on (more of a trace only makes it younger)
                self._quiet = (min(self._quiet[0], access.end_ns), self._quiet[1])
            self._by_trace.put(access.trace_id, [access])
        else:
            trace.append(access)

    def _supersede(self, access: Access) -> None:
        """An access whose key stage 2 inferred (``processors.correlation.keying``) replaces the unkeyed one of its
        span: the trace's statements and the table's predicate statements hold the keyed one only."""
        mine = self._by_trace.peek(access.trace_id)
        self._quiet = None
        if mine is not None:
            mine[:] = [a for a in mine if a.span_id != access.span_id]
        scope = self._entities.get(scope_key(access.table))
        if scope is not None:
            for old in [a for a in scope.accesses if a.span_id == access.span_id and a.trace_id == access.trace_id]:
                scope.accesses.remove(old)
        self.telemetry.count(f"keyed_{access.keying}")

    def on_commit(self, entity: str, commit: Commit, part: str = "") -> None:
        at = commit.change.commit_ts_ms * MS_NS
        self._past_history(entity, at)
        state = self._entities.retain(entity)
        state.part = part or state.part
        state.changed_ns = max(state.changed_ns, at)
        table = entity.partition(":")[0]
        self._captured.add(table)
        scope = self._entities.get(scope_key(table))
        if scope is not None:
            scope.changed_ns = max(scope.changed_ns, at)
        if at <= state.judged_until_ns:  # Debezium behind the settle time: what it can change is judged again
            if any(c.change.lsn == commit.change.lsn for c in state.commits):
                self.telemetry.count("redelivered")  # a replay of what was judged: nothing new to judge
                return
            self._rejudge(state, commit, at)
        self._hold(entity, state, f"@{commit.change.lsn}", at)
        if len(state.commits) == state.commits.maxlen:
            self.telemetry.drop("history_per_entity")
        state.commits.append(commit)
        self.telemetry.count("commits")
        self._touch(entity, state, at)
        if commit.trace_id:
            mine = self._commits.get(commit.trace_id)
            if mine is None:
                if self._quiet is not None:
                    self._quiet = (min(self._quiet[0], at), self._quiet[1])
                self._commits.put(commit.trace_id, [(entity, commit)])
            elif (entity, commit) not in mine:
                mine.append((entity, commit))

    def _past_history(self, key: str, event_ns: int) -> None:
        """Input so late that its row's history, which it should have been judged with, is gone (the row kept only
        statements a window or more away from it, if any): counted."""
        if event_ns >= self._pruned_ns:
            return  # on time: nothing to look at (the scan below is for late input only, off the hot path)
        state = self._entities.get(key)
        if state is not None and any(abs(a.end_ns - event_ns) <= self.window_ns for a in state.accesses):
            return
        if key.endswith(":*") or scope_key(key.partition(":")[0]) not in self._entities:
            self.telemetry.count("late_past_history")  # (not a row a held scope's predicates may still cover)

    def _rejudge(self, state: EntityHistory, commit: Commit, at: int) -> None:
        """A row change arriving after its row was judged past it: the pairs it bears on are judged again (what
        was reported stays reported): its trace's, or, not credited, those of every trace that wrote the row in the
        window before it."""
        self.telemetry.count("late_commits")
        if commit.trace_id:
            state.judged.discard(commit.trace_id)
        else:
            state.judged -= {a.trace_id for a in state.accesses if at - self.window_ns <= a.start_ns <= at
                             and a.operation in WRITES}  # fmt: skip

    def on_revoke(self, part: str) -> None:
        """Internal partition ``part`` went to another instance: the rows it fed go here, with the input they held.
        Their new owner replays what is not judged yet (from the offset those pins held) and judges it; judged here
        as well, the same pair would be reported twice, by two instances at once."""
        gone = [(key, state) for key, state in self._entities.items() if state.part == part]
        for key, state in gone:
            self._evicted(key, state)  # its deadline and the input it held go, then its history
            self._entities.discard(key)
        self.telemetry.count("revoked_rows", len(gone))

    def on_watermark(self, watermark_ns: int, open_since_ns: int | None, out: Emit) -> None:
        for collision in self.close_until(watermark_ns, out.quarantined):
            try:
                out.events.append(incident_event(collision, watermark_ns))
            except Exception as exc:  # one incident that cannot be rendered: the others go out
                out.quarantined.append(Quarantined(f"incident on {collision.entity}", exc))

    # ---- judging ------------------------------------------------------------------------------------------------

    def _lead(self, key: str) -> int:
        """How long after an event its entity is due: a window and the settle time; a scope one window more."""
        return self.window_ns * (2 if key.endswith(":*") else 1) + self.settle_ns

    def _touch(self, key: str, state: EntityHistory, event_ns: int) -> None:
        """The entity is due one window plus the settle time after its oldest event not judged yet."""
        state.last_ns = max(state.last_ns, event_ns)
        due = max(event_ns, state.judged_until_ns) + self._lead(key)  # late input: judged soon
        current = self._deadlines.at(key)
        if current is None or due < current:
            self._deadlines.set(key, due)

    def close_until(self, watermark_ns: int, quarantined: list[Quarantined] | None = None) -> list[Collision]:
        """Judge what the watermark has passed on every due entity; release its input; prune what is too old.
        A row whose judging raises is dropped and appended to ``quarantined`` (see the module docstring)."""
        found: list[Collision] = []
        failed = quarantined if quarantined is not None else []
        until = watermark_ns - self.window_ns - self.settle_ns
        due = self._deadlines.due(watermark_ns)
        # Rows first: a row judged now may pair with a scope's predicate statements that this call prunes after.
        for key in sorted(due, key=lambda k: k.endswith(":*")):
            state = self._entities.get(key)
            if state is None:
                continue
            try:
                self._close(key, state, watermark_ns, until, found)
            except Exception as exc:
                failed.append(Quarantined(f"row {key}", exc, tuple(("entity_inputs", slot) for slot in state.inputs)))
                self._evicted(key, state)  # its deadline and the input it held go, then its history
                self._entities.discard(key)
        try:
            self._pruned_ns = max(self._pruned_ns, until - 2 * self.window_ns)
            self._forget_traces(until - 3 * self.window_ns, until)
        except Exception as exc:
            failed.append(Quarantined("traces past the pruning horizon", exc))
        t = self.telemetry
        t.gauge("rows", len(self._entities))
        t.gauge("traces", len(self._by_trace))
        t.gauge("held_traces", len(self._held_traces))
        t.gauge("pinned_inputs", len(self._inputs))
        return found

    def _close(self, key: str, state: EntityHistory, watermark_ns: int, until: int, found: list[Collision]) -> None:
        """Judge one due entity (a row; a scope is only pruned), release the input of what is judged, prune its
        history and set when it is due again. A collision goes into ``found`` as soon as it is reported."""
        scope = key.endswith(":*")
        cut = watermark_ns - self._lead(key)
        if not scope:  # a scope is not judged itself: the rows its predicates cover look it up
            self.telemetry.count("judged")
            for collision in self.judge.judge(key, state, self.memory, until_ns=until):
                if self._reported.add(collision.pair):
                    found.append(collision)
                    inexact = {"undecided": undecided, "inferred": inferred}
                    for what, test in inexact.items():  # keys not on spans: how often an incident rests on them
                        if any(test(a) for a in collision.accesses):
                            self.telemetry.count(f"incidents_{what}")
                else:
                    self.telemetry.count("already_reported")
        state.judged_until_ns = max(state.judged_until_ns, cut)
        later = self._release_judged(state, cut)
        if later is not None:  # events not judged yet: due again one window after the oldest of them
            self._deadlines.set(key, later + self._lead(key))
        horizon = until - 2 * self.window_ns
        held = self._awaiting_change(key, state, until)
        if held is not None:  # kept from a window before the write whose change may still come
            horizon = min(horizon, held[0] - 2 * self.window_ns)
            self.telemetry.count("held_for_changes")
            if self._quiet is not None:  # a hold that lapses first
                self._quiet = (self._quiet[0], min(self._quiet[1], held[1] + self.late_ns))
            for a in state.accesses:  # and the traces on it, for the classes that span rows
                self._held_traces.put(a.trace_id, max(self._held_traces.peek(a.trace_id) or -1,
                                                      held[1] + self.late_ns))  # fmt: skip
        while state.accesses and state.accesses[0].end_ns < horizon:
            state.accesses.popleft()
        state.judged &= {a.trace_id for a in state.accesses}
        while state.commits and state.commits[0].change.commit_ts_ms * MS_NS < horizon:
            state.commits.popleft()
        if not state.accesses and not state.commits and not state.inputs and key not in self._deadlines:
            self._entities.discard(key)  # nothing left to pair with: the row's history goes
        elif key not in self._deadlines and held is not None:  # due again when Debezium's lag bound passes
            self._deadlines.set(key, held[1] + self.late_ns + watermark_ns - until + 1)
        elif key not in self._deadlines:  # judged, still young: due again when its newest event can be pruned
            newest = max([a.end_ns for a in state.accesses] + [commit_ns(c) for c in state.commits], default=0)
            self._deadlines.set(key, newest + watermark_ns - horizon + 1)

    def _awaiting_change(self, key: str, state: EntityHistory, until_ns: int) -> tuple[int, int] | None:
        """The start and end of the oldest write no change of its row (of its table, for a scope) has followed yet,
        while Debezium may still send that change (``late_ns``, ``windows.max_cdc_lag_s``); None if there is none.
        "Followed" is ``change_followed``. Only a table Debezium has sent a change of (captured) has rows waiting; a
        scope waits in any case, since a table's first change (which names its key, until when its statements are
        predicates) may be the late one."""
        if not self.late_ns or (not key.endswith(":*") and key.partition(":")[0] not in self._captured):
            return None
        waiting = [a for a in state.accesses if a.operation in WRITES and until_ns <= a.end_ns + self.late_ns
                   and not change_followed(a.end_ns, state.changed_ns, self.skew_ns)]  # fmt: skip
        if not waiting:
            return None
        oldest = min(waiting, key=lambda a: a.start_ns)
        return oldest.start_ns, oldest.end_ns

    def _forget_traces(self, before_ns: int, until_ns: int) -> None:
        """Traces whose statements all ended before ``before_ns`` (no row they touched can be judged against
        them any more), oldest first: their accesses and credited commits go; but a trace on a row held for a late
        change (``_held_traces``, until ``until_ns`` passes its hold) stays, moved to the back: the classes that
        span rows (write skew, phantoms) look its statements and commits up when the change comes. Once a call
        found old traces held, the next ones do nothing until a hold lapses or another trace gets old (``_quiet``):
        an idle daemon's every watermark would walk every held trace again."""
        quiet = self._quiet
        if quiet is not None and before_ns <= quiet[0] and until_ns <= quiet[1]:
            return
        while (hold := self._held_traces.oldest()) is not None and hold[1] < until_ns:
            self._held_traces.pop(hold[0])  # (held in the order of their holds' ends, nearly: a lapse is found late)
        looked = 0
        while (oldest := self._by_trace.oldest()) is not None and max(a.end_ns for a in oldest[1]) < before_ns:
            if (self._held_traces.peek(oldest[0]) or -1) < until_ns:
                self._by_trace.pop(oldest[0])
            elif (looked := looked + 1) <= len(self._by_trace):
                self._by_trace.get(oldest[0])  # to the back
            else:
                break  # every old trace left is held
        full, looked = looked > len(self._by_trace), 0
        while (old := self._commits.oldest()) is not None and all(
            c.change.commit_ts_ms * MS_NS < before_ns for _, c in old[1]
        ):
            if (self._held_traces.peek(old[0]) or -1) < until_ns:
                self._commits.pop(old[0])
            elif (looked := looked + 1) <= len(self._commits):
                self._commits.get(old[0])
            else:
                break
        if full or looked > len(self._commits):  # every old trace held: none can go before a hold lapses or another
            self._quiet = self._quiet_until(until_ns)  # trace gets old; the next calls need not walk them again

    def _quiet_until(self, until_ns: int) -> tuple[int, int]:
        """The pruning horizons up to which no trace can be forgotten: the oldest end of a trace not held (its last
        statement's, or its last credited commit's), and the first hold to lapse."""
        holds = {t: h for t, h in self._held_traces.items() if h >= until_ns}
        ends = [max(a.end_ns for a in accs) for t, accs in self._by_trace.items() if accs and t not in holds]
        ends += [max(commit_ns(c) for _, c in cs) for t, cs in self._commits.items() if cs and t not in holds]
        return min(ends, default=_NEVER), min(holds.values(), default=_NEVER)

    def _release_judged(self, state: EntityHistory, until_ns: int) -> int | None:
        """Release the input of what is judged; the oldest event time still waiting, if any."""
        for slot in state.inputs.release_until(until_ns):
            self._inputs.discard(slot)
        return state.inputs.oldest()
