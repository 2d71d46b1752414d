"""A stage-1 instance's share of a closed statistics window, relayed to the judge in stage 2.

Each stage-1 instance (``--workers``) counts only the spans partitions it owns. The tests need the window's whole
traffic, so stage 1 relays each closed window's statistics per (input partition, operation, version) on the
internal topic, all under one key (one internal partition, one stage-2 instance), ahead of the watermark that
promises them; the judge (``judge.RegressionJudge``) merges the shares of a window and tests it once stage 2's event
time has passed the window's end plus the trace gap. A share carries what the tests and the event read: counts,
error signatures, the latency sketch, the latency sample (with how many values it stands for, so that shares merge
by weighted sampling) and the critical-path ownership of the slowest requests. Code sites stay in stage 1.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, NonNegativeInt

from processors.detectors.regressions.stats import OpStats, Reservoir, StatsWindow
from processors.lib.sketch import LatencySketch
from processors.model.events import Relay

COMPONENT = "regressions"  # the judge's processor name
KEY = "regressions"  # every share under one key: one internal partition, one judge


class Share(BaseModel):
    """A relay's body: one (input partition, operation, version) of one closed window."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    start_ns: int
    end_ns: int
    part: str
    service: str
    operation: str
    version: str
    label: str
    revision: str
    requests: NonNegativeInt
    errors: NonNegativeInt
    signatures: dict[str, NonNegativeInt]
    bins: list[int]
    bin_counts: list[NonNegativeInt]
    min: float
    max: float
    samples: list[float]
    seen: NonNegativeInt
    first_ns: int
    path_ns: dict[str, int]
    path_traces: NonNegativeInt
    sampled: dict[str, NonNegativeInt] = {}  # (absent from the shares of a daemon that did not read sampling)

    def op(self, reservoir_size: int) -> OpStats:
        if len(self.bins) != len(self.bin_counts):
            raise ValueError("share: bins and bin_counts differ in length")
        return OpStats(
            self.service, self.operation, self.version, self.label, self.revision, requests=self.requests,
            errors=self.errors, signatures=dict(self.signatures),
            latency=LatencySketch.from_row(self.bins, self.bin_counts, self.min, self.max),
            samples=Reservoir(reservoir_size, list(self.samples[:reservoir_size]), self.seen),
            first_ns=self.first_ns, path_ns=dict(self.path_ns), path_traces=self.path_traces,
            sampled=dict(self.sampled),
        )  # fmt: skip


def shares(window: StatsWindow) -> list[Relay]:
    """The relays of a closed window: one per (input partition, operation, version)."""
    out = []
    for part, ops in sorted(window.parts.items()):
        for _, op in sorted(ops.items()):
            sketch = op.latency.to_row()
            share = Share(
                start_ns=window.start_ns, end_ns=window.end_ns, part=part, service=op.service,
                operation=op.operation, version=op.version, label=op.label, revision=op.revision,
                requests=op.requests, errors=op.errors, signatures=op.signatures, bins=sketch["bins"],
                bin_counts=sketch["bin_counts"], min=sketch["min"], max=sketch["max"], samples=op.samples.values,
                seen=op.samples.seen, first_ns=op.first_ns, path_ns=op.path_ns, path_traces=op.path_traces,
                sampled=op.sampled,
            )  # fmt: skip
            out.append(Relay(COMPONENT, KEY, window.end_ns, share.model_dump()))
    return out
