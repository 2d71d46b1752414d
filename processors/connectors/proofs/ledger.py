"""The proof judge's ledger: its counts per (build, slice, input partition), and how they add up across instances.

An open slice is keyed state (``proof_slices``) that holds its input, so a crash or a rebalance replays it whole.
A slice that has settled (older than the judge's horizon) is added to the cumulative *contribution* of its
(build, partition); contributions that changed are handed out to be written to the graph, and contributions read
back from it (the other instances', and ours from before a restart) are loaded. A build's counts are the sum of
its partitions' contributions; a partition this instance takes over continues from its stored contribution and
never counts a slice the stored one already holds.
"""

from __future__ import annotations

from collections.abc import Callable

from processors.api.provenance import StateEvents
from processors.api.telemetry import Telemetry
from processors.connectors.proofs.tallies import COUNTED_IDS, Build, Contribution, PartKey, SliceKey, Tally
from processors.state.keyed import KeyedState


class Ledger:
    """See the module docstring; ``build`` finds (or creates) a build by service, version, first time, revision."""

    def __init__(
        self,
        slice_ns: int,
        max_open_slices: int,
        telemetry: Telemetry,
        events: StateEvents,
        build: Callable[[str, str, int, str], Build],
        find: Callable[[str, str], Build | None],
    ) -> None:
        self.slice_ns = slice_ns
        self.telemetry = telemetry
        self.horizon = 0
        self._build = build
        self._find = find
        self._slices: KeyedState[SliceKey, Tally] = KeyedState(
            "proof_slices", bound=max_open_slices, new=lambda _key: Tally(), telemetry=telemetry, events=events,
            reason="max_open_slices",
        )  # fmt: skip
        self._own: dict[PartKey, Contribution] = {}  # partitions this instance counts
        self._others: dict[PartKey, Contribution] = {}  # loaded: other instances' (and ours before a restart)
        self._written: dict[PartKey, int] = {}  # last settled_until_ns handed out by contributions()
        self._taken: dict[PartKey, int] = {}  # settled_until_ns of a stored contribution this instance took over
        self._stale: set[tuple[str, str]] = set()  # builds whose settled counts need summing again

    def open_slices(self, service: str, version: str) -> list[Tally]:
        return [t for (svc, ver, _, _), t in self._slices.items() if (svc, ver) == (service, version)]

    def slice(self, build: Build, at_ns: int, part: str, occurrence: str = "") -> Tally:
        """The open slice of (build, partition) at ``at_ns``, holding the input being processed; a scratch tally
        for input already counted (``occurrence``: the event id of a collision or finding, remembered when it is
        counted late, straight into the contribution)."""
        end = at_ns - at_ns % self.slice_ns + self.slice_ns
        key = (build.service, build.version, part)
        own = self._own.get(key)
        if own is None:
            own = self._contribution(build, part)
        if end <= self._taken.get(key, 0):
            # Replayed input of a slice the stored contribution we took over already holds (a restart, a
            # rebalance, a replay from zero): counting it again would double it.
            self.telemetry.count("already_counted")
            return Tally()
        if occurrence and occurrence in own.tally.counted:  # replayed after a restart: counted before it
            self.telemetry.count("occurrence_replayed")
            return Tally()
        if end <= own.settled_until_ns or end <= self.horizon:
            # Late for a settled slice (a collision found after its slice settled): counted straight into the
            # contribution, written with the next one.
            self.telemetry.count("late_for_slice")
            self._written.pop(key, None)
            self._stale.add((build.service, build.version))
            # A contribution counted only late (an incidents partition's: every collision arrives after its slice
            # settled) still spans its build's event time, or the graph's retention, in event time, takes it for
            # one from the epoch and deletes it: a restarted judge would then lose what was counted before.
            own.first_ns = min(own.first_ns or build.first_ns, build.first_ns)
            own.last_ns, own.revision = max(own.last_ns, build.last_ns, at_ns), build.revision
            if occurrence:
                remember(own.tally, [occurrence])
            return own.tally
        t = self._slices.retain((build.service, build.version, end - self.slice_ns, part))
        if occurrence:
            t.counted.append(occurrence)  # joins the contribution's when the slice settles
        return t

    def _contribution(self, build: Build, part: str) -> Contribution:
        """This instance's contribution of (build, partition); a partition counted elsewhere before is taken over
        from where its stored contribution ends."""
        key = (build.service, build.version, part)
        own = self._own.get(key)
        if own is None:
            if key in self._others:
                own = self._own[key] = self._others.pop(key)
                self._taken[key] = own.settled_until_ns
            else:
                own = self._own[key] = Contribution(first_ns=build.first_ns)
        return own

    def settle(self, horizon: int) -> None:
        """Add every slice that ended by ``horizon`` to its contribution, and release its input."""
        self.horizon = max(self.horizon, horizon)
        for key in [k for k in self._slices if k[2] + self.slice_ns <= self.horizon]:
            service, version, start, part = key
            tally = self._slices.discard(key)
            build = self._find(service, version)
            if tally is None or build is None:
                continue  # its build was dropped by the bound
            own = self._contribution(build, part)
            own.tally.merge(tally)
            remember(own.tally, tally.counted)
            own.settled_until_ns = max(own.settled_until_ns, start + self.slice_ns)
            own.first_ns, own.last_ns, own.revision = build.first_ns, build.last_ns, build.revision
            self._stale.add((service, version))

    def settled(self, build: Build) -> Tally:
        """The build's settled counts: the sum of every partition's contribution (ours and the others')."""
        if (build.service, build.version) in self._stale:
            self._stale.discard((build.service, build.version))
            total = Tally()
            for source in (self._own, self._others):
                for (service, version, _), c in source.items():
                    if (service, version) == (build.service, build.version):
                        total.merge(c.tally)
            build.settled = total
        return build.settled

    # ---- contributions (written to the graph; loaded from it) -------------------------------------------

    def contributions(self) -> list[tuple[PartKey, Contribution]]:
        """This instance's contributions that changed since the last call (to write)."""
        out = []
        for key, own in self._own.items():
            if self._written.get(key) != own.settled_until_ns:
                self._written[key] = own.settled_until_ns
                out.append((key, own))
        return out

    def load(self, stored: list[tuple[PartKey, Contribution]]) -> None:
        """Contributions read back from the graph: the other instances', and ours from before a restart."""
        for key, c in stored:
            if key in self._own:
                continue  # ours: we hold the newer counts
            self._others[key] = c
            service, version, _ = key
            build = self._build(service, version, c.first_ns, c.revision)
            build.first_ns = min(build.first_ns, c.first_ns)
            build.last_ns = max(build.last_ns, c.last_ns)
            self._stale.add((service, version))

    def revoke(self, part: str) -> None:
        """A partition went to another instance: its open slices go (replayed there); its contribution, as it
        stands, becomes one of the others' (the new owner takes it over from the graph)."""
        for open_slice in [k for k in self._slices if k[3] == part]:
            self._slices.discard(open_slice)
        for key in [k for k in self._own if k[2] == part]:
            self._others[key] = self._own.pop(key)
            self._written.pop(key, None)
            self._taken.pop(key, None)


def remember(tally: Tally, occurrences: list[str]) -> None:
    """Add the event ids of occurrences counted into ``tally`` to those it remembers (the newest ``COUNTED_IDS``)."""
    if occurrences:
        tally.counted.extend(occurrences)
        del tally.counted[:-COUNTED_IDS]
