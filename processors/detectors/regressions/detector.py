"""Regression detection on closed statistics windows: exact tests on error counts, a rank test on latency.

Each closed window's (service, operation, version) is compared twice:

* ``baseline``: against the same key over the previous ``baseline_windows`` windows (a rolling baseline);
* ``version``: against the service's previous version (the one first seen before it) on the same operation, over
  the same rolling history plus the current window (a canary shares windows with the build it replaces).

Per error signature with errors now, the one-sided conditional binomial test asks whether its rate went up; per
key, the one-sided Mann-Whitney U test on the latency samples asks whether latencies went up (and the median or
p95 must have grown by ``min_latency_ratio``, so that a significant but negligible shift is not a regression).
Benjamini-Hochberg at ``fdr`` runs over all tests of the window. Too little traffic gives ``InsufficientData``
(how many more requests, samples or errors a verdict needs), never a verdict. Regressions become
``RegressionEvent`` s with the evidence and the critical-path ownership shift of the slowest requests.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

from processors.api.telemetry import Telemetry
from processors.detectors.regressions.sampling import sampling_differs
from processors.detectors.regressions.stats import OpStats, StatsKey, StatsWindow, merge
from processors.lib.stat_tests import (
    StatResult,
    benjamini_hochberg,
    conditional_binomial,
    errors_needed,
    mann_whitney,
)
from processors.model.regression import Evidence, PathShare, RegressionEvent
from processors.model.units import MS_NS
from processors.pipeline.critical_path import shift


@dataclass(frozen=True, slots=True)
class InsufficientData:
    """A comparison that cannot be judged yet, and how much more it needs."""

    service: str
    operation: str
    version: str
    comparison: str
    metric: str
    signature: str
    requests: int
    requests_needed: int  # more requests (or latency samples) of the current window's key
    baseline_requests: int
    baseline_needed: int  # more in the baseline
    errors_needed: int  # for count tests: errors that, all on the current side, could be significant
    reason: str


@dataclass(frozen=True, slots=True)
class Findings:
    """What one closed window showed."""

    regressions: list[RegressionEvent]
    insufficient: list[InsufficientData]
    tests: int  # hypotheses in the Benjamini-Hochberg family


@dataclass(frozen=True, slots=True)
class DetectorSettings:
    baseline_windows: int = 10
    fdr: float = 0.05
    min_requests: int = 30  # per side, for count tests
    min_samples: int = 20  # per side, for the rank test
    min_latency_ratio: float = 1.2  # p50 or p95 must grow at least this much
    reservoir_size: int = 256
    max_versions: int = 16  # per service, for the previous-version lookup
    seed: int = 0


@dataclass(frozen=True, slots=True)
class _Candidate:
    key: StatsKey
    signature: str
    metric: str
    comparison: str
    before: OpStats
    before_windows: tuple[str, ...]
    after: OpStats
    result: StatResult
    gate: bool  # the practical-size condition (latency); True for counts


def regression_fingerprint(service: str, operation: str, signature: str) -> str:
    """Same regression, same fingerprint, whichever window or build shows it."""
    return hashlib.sha256(f"{service}|{operation}|{signature}|regression".encode()).hexdigest()[:16]


def _finite(v: float) -> float | None:
    return None if v != v or v in (float("inf"), float("-inf")) else v


class RegressionDetector:
    """Compares each closed statistics window with its rolling baseline and with the previous version."""

    def __init__(self, settings: DetectorSettings | None = None, *, telemetry: Telemetry | None = None) -> None:
        self.settings = settings or DetectorSettings()
        self._history: deque[StatsWindow] = deque(maxlen=self.settings.baseline_windows)
        self._versions: dict[str, dict[str, int]] = {}  # service -> version -> first seen (event time)
        self._rng = random.Random(self.settings.seed)
        self.telemetry = telemetry or Telemetry("regressions")

    def previous_version(self, service: str, version: str) -> str:
        """The version of ``service`` first seen last before ``version`` ("" if none is known)."""
        seen = self._versions.get(service, {})
        mine = seen.get(version)
        if mine is None:
            return ""
        earlier = [(t, v) for v, t in seen.items() if t < mine or (t == mine and v < version)]
        return max(earlier)[1] if earlier else ""

    def _learn(self, window: StatsWindow) -> None:
        for (service, _, version), op in window.ops.items():
            seen = self._versions.setdefault(service, {})
            seen[version] = min(seen.get(version, op.first_ns), op.first_ns)
            if len(seen) > self.settings.max_versions:
                del seen[min(seen, key=lambda v: seen[v])]

    def on_window(self, window: StatsWindow) -> Findings:
        """Test one closed window against the history, then add it to the history."""
        self._learn(window)
        candidates: list[_Candidate] = []
        insufficient: list[InsufficientData] = []
        for key, current in sorted(window.ops.items()):
            for comparison, before, ids in self._baselines(key, window):
                if self._sampling(key, comparison, before, current, insufficient):
                    continue
                self._count_tests(key, comparison, before, ids, current, candidates, insufficient)
                self._latency_test(key, comparison, before, ids, current, candidates, insufficient)
        adjusted = benjamini_hochberg([c.result.p_value for c in candidates])
        flagged: dict[str, list[tuple[_Candidate, float]]] = {}
        for c, p_adj in zip(candidates, adjusted, strict=True):
            if p_adj <= self.settings.fdr and c.gate:
                flagged.setdefault(regression_fingerprint(c.key[0], c.key[1], c.signature), []).append((c, p_adj))
        events = [self._event(fp, hits, window) for fp, hits in sorted(flagged.items())]
        self._history.append(window)
        self.telemetry.count("windows", 1)
        self.telemetry.count("tests", len(candidates))
        self.telemetry.count("regressions", len(events))
        self.telemetry.count("insufficient", len(insufficient))
        return Findings(events, insufficient, len(candidates))

    def _baselines(self, key: StatsKey, window: StatsWindow) -> list[tuple[str, OpStats, tuple[str, ...]]]:
        service, operation, version = key
        out: list[tuple[str, OpStats, tuple[str, ...]]] = []
        size = self.settings.reservoir_size
        own = [w for w in self._history if key in w.ops]
        base = merge([w.ops[key] for w in own], self._rng, size)
        if base is not None:
            out.append(("baseline", base, tuple(w.window_id for w in own)))
        previous = self.previous_version(service, version)
        if previous:
            pkey = (service, operation, previous)
            theirs = [w for w in (*self._history, window) if pkey in w.ops]
            prev = merge([w.ops[pkey] for w in theirs], self._rng, size)
            if prev is not None:
                out.append(("version", prev, tuple(w.window_id for w in theirs)))
        return out

    def _sampling(self, key: StatsKey, comparison: str, before: OpStats, after: OpStats,
                  insufficient: list[InsufficientData]) -> bool:  # fmt: skip
        """True (and the comparison reported insufficient) when the two sides' sampling forbids the tests."""
        reason = sampling_differs(before, after, comparison)
        if reason:
            self.telemetry.count("sampling_mismatches", 1)
            insufficient.append(InsufficientData(*key, comparison, "sampling", "", after.requests, 0, before.requests,
                                                 0, 0, reason))  # fmt: skip
        return bool(reason)

    def _count_tests(self, key: StatsKey, comparison: str, before: OpStats, ids: tuple[str, ...], after: OpStats,
                     out: list[_Candidate], insufficient: list[InsufficientData]) -> None:  # fmt: skip
        s = self.settings
        for signature, errors in sorted(after.signatures.items()):
            if errors == 0:
                continue
            e_before = before.signatures.get(signature, 0)
            need_after = max(0, s.min_requests - after.requests)
            need_before = max(0, s.min_requests - before.requests)
            share = after.requests / (after.requests + before.requests)
            k_needed = errors_needed(share, s.fdr)
            if need_after or need_before or e_before + errors < k_needed:
                if need_after or need_before:
                    reason = (f"{after.requests} requests now and {before.requests} in the {comparison}; "
                              f"each side needs {s.min_requests}")  # fmt: skip
                else:
                    reason = (f"{e_before + errors} error(s) in all: even all of them now could not be significant "
                              f"at this traffic split; {k_needed} needed")  # fmt: skip
                insufficient.append(InsufficientData(*key, comparison, "errors", signature, after.requests,
                                                     need_after, before.requests, need_before,
                                                     max(0, k_needed - e_before - errors), reason))  # fmt: skip
                continue
            result = conditional_binomial(e_before, before.requests, errors, after.requests, "greater")
            out.append(_Candidate(key, signature, "errors", comparison, before, ids, after, result, True))

    def _latency_test(self, key: StatsKey, comparison: str, before: OpStats, ids: tuple[str, ...], after: OpStats,
                      out: list[_Candidate], insufficient: list[InsufficientData]) -> None:  # fmt: skip
        s = self.settings
        b50, a50 = before.latency.quantile(0.5), after.latency.quantile(0.5)
        b95, a95 = before.latency.quantile(0.95), after.latency.quantile(0.95)
        grown = (b50 > 0 and a50 / b50 >= s.min_latency_ratio) or (b95 > 0 and a95 / b95 >= s.min_latency_ratio)
        n_before, n_after = len(before.samples.values), len(after.samples.values)
        signature = f"latency:{after.label or after.operation}"
        if n_before < s.min_samples or n_after < s.min_samples:
            if grown:
                reason = (f"p50 {b50:.3g} -> {a50:.3g} ms, p95 {b95:.3g} -> {a95:.3g} ms on {n_after} sample(s) "
                          f"now and {n_before} in the {comparison}; each side needs {s.min_samples}")  # fmt: skip
                insufficient.append(InsufficientData(*key, comparison, "latency", signature, n_after,
                                                     max(0, s.min_samples - n_after), n_before,
                                                     max(0, s.min_samples - n_before), 0, reason))  # fmt: skip
            return
        b99 = before.latency.quantile(0.99)
        grown = grown or (b99 > 0 and after.latency.quantile(0.99) / b99 >= s.min_latency_ratio)
        result = _latency_result(before.samples.values, after.samples.values, s.fdr)
        out.append(_Candidate(key, signature, "latency", comparison, before, ids, after, result, grown))

    def _event(
        self, fingerprint: str, hits: Sequence[tuple[_Candidate, float]], window: StatsWindow
    ) -> RegressionEvent:
        first, p_adj = min(hits, key=lambda h: (h[1], h[0].comparison != "version"))
        service, operation, version = first.key
        after = first.after
        evidence = [_evidence(c, p, window.window_id) for c, p in hits]
        previous = next((c.before.version for c, _ in hits if c.comparison == "version"), "")
        moves = shift(first.before.path_ns, after.path_ns)[:8]
        occurrence = hashlib.sha256(f"{fingerprint}|{window.window_id}|{version}".encode()).hexdigest()[:16]
        return RegressionEvent(
            fingerprint=fingerprint,
            occurrence=occurrence,
            service=service,
            operation=operation,
            signature=first.signature,
            metric=first.metric,
            version=version,
            previous_version=previous,
            commit=after.revision,
            window=window.window_id,
            window_start_unix_ms=window.start_ns / MS_NS,
            window_end_unix_ms=window.end_ns / MS_NS,
            summary=_summary(first, p_adj),
            evidence=evidence,
            critical_path=[
                PathShare(owner=m.owner, before=m.before, after=m.after, delta=round(m.delta, 4)) for m in moves
            ],
            detected_at_unix_ms=window.end_ns / MS_NS,
            build_first_seen_unix_ms=self._versions.get(service, {}).get(version, window.start_ns) / MS_NS,
        )


def tail_exceedance(before: Sequence[float], after: Sequence[float]) -> StatResult:
    """How many of each side's samples exceed the baseline's p99 (nearest rank), compared by the one-sided
    conditional binomial test: a few requests far slower (a hang on a few percent of them) move no rank test."""
    ranked = sorted(before)
    cut = ranked[min(len(ranked) - 1, math.ceil(0.99 * len(ranked)) - 1)]
    result = conditional_binomial(sum(v > cut for v in before), len(before), sum(v > cut for v in after), len(after))
    return replace(result, test=f"tail exceedance over the baseline p99 ({cut:.4g} ms), {result.test}")


def _latency_result(before: Sequence[float], after: Sequence[float], fdr: float) -> StatResult:
    """Mann-Whitney U (a shift of the whole distribution) and the tail exceedance test (a few far slower), the
    smaller p-value Bonferroni-corrected for the two; Mann-Whitney's when it alone is significant so."""
    rank = mann_whitney(before, after, "greater")
    tail = tail_exceedance(before, after)
    best = rank if 2 * rank.p_value <= fdr or rank.p_value <= tail.p_value else tail
    return replace(best, p_value=min(1.0, 2 * best.p_value))


def _evidence(c: _Candidate, p_adj: float, window_id: str) -> Evidence:
    b, a = c.before, c.after
    counts = c.metric == "errors"
    low, high = c.result.interval if c.result.interval else (None, None)
    return Evidence(
        comparison=c.comparison,
        metric=c.metric,
        test=c.result.test,
        before_version=b.version,
        after_version=a.version,
        before_windows=list(c.before_windows),
        after_window=window_id,
        before_requests=b.requests,
        before_errors=b.signatures.get(c.signature, 0) if counts else b.errors,
        after_requests=a.requests,
        after_errors=a.signatures.get(c.signature, 0) if counts else a.errors,
        before_rate=round((b.signatures.get(c.signature, 0) if counts else b.errors) / b.requests, 6),
        after_rate=round((a.signatures.get(c.signature, 0) if counts else a.errors) / a.requests, 6),
        before_p50_ms=round(b.latency.quantile(0.5), 3),
        after_p50_ms=round(a.latency.quantile(0.5), 3),
        before_p95_ms=round(b.latency.quantile(0.95), 3),
        after_p95_ms=round(a.latency.quantile(0.95), 3),
        before_samples=len(b.samples.values),
        after_samples=len(a.samples.values),
        statistic=c.result.statistic,
        effect=_finite(c.result.effect) if c.result.effect is not None else None,
        p_value=c.result.p_value,
        p_adjusted=p_adj,
        ratio_low=_finite(low) if low is not None else None,
        ratio_high=_finite(high) if high is not None else None,
    )


def _summary(c: _Candidate, p_adj: float) -> str:
    a, b = c.after, c.before
    against = f"{b.version} (previous version)" if c.comparison == "version" else f"{len(c.before_windows)} window(s)"
    where = f"{a.label or a.operation} on {a.service} {a.version}"
    if c.metric == "errors":
        ea, eb = a.signatures.get(c.signature, 0), b.signatures.get(c.signature, 0)
        what = f"{c.signature}: {ea}/{a.requests} now vs {eb}/{b.requests} in {against}"
    else:
        what = (f"latency p50 {b.latency.quantile(0.5):.3g} -> {a.latency.quantile(0.5):.3g} ms, "
                f"p95 {b.latency.quantile(0.95):.3g} -> {a.latency.quantile(0.95):.3g} ms vs {against}")  # fmt: skip
    return f"{where}: {what} ({c.result.test} p={c.result.p_value:.3g}, BH-adjusted {p_adj:.3g})"
