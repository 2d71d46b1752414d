"""A decision in words: the reason a published verdict carries, written from the judge's typed decision only.

Nothing here decides anything and nothing reads a reason back; see :mod:`~processors.connectors.proofs.decision`.
"""

from __future__ import annotations

from collections.abc import Callable

from processors.connectors.proofs.decision import Decision, Rule


def reason(d: Decision) -> str:
    """The verdict's reason: the rule's sentence, prefixed with why sampling kept rates from being compared."""
    text = RULES[d.rule](d)
    if d.unweighted:
        return f"{d.sampling}; so no {d.unweighted} (unweighted, it read: {text})"
    return f"{d.sampling}; and {text}" if d.sampling else text


def _look(d: Decision) -> str:
    return f"{d.alpha / d.looks:g}"


def _was(d: Decision) -> str:
    """The earlier build a signature's counts are compared with."""
    if d.before is None:
        return "never seen before"
    return f"before: {d.before.count}/{d.before.requests} on {d.before_version}"


def _worse(d: Decision) -> str:
    assert d.before is not None and d.p_value is not None
    gone = f"{d.signature!r} remains" if d.signature_seen else "the contract's signature is gone"
    return (f"{d.version} fails {d.after.count}/{d.after.requests} requests vs {d.before.count}/{d.before.requests} on "
            f"{d.before_version}: worse overall (p={d.p_value:.3g} <= {_look(d)}), roll back; {gone}; new errors at "
            f"{', '.join(d.new_errors) or 'n/a'}")  # fmt: skip


def _recurs(d: Decision) -> str:
    return (f"{d.signature!r} still happens on {d.version}: {d.after.count} of {d.after.requests} requests, at "
            f"{'; '.join(d.after.sites) or 'unknown site'} ({_was(d)})")  # fmt: skip


def _moved(d: Decision) -> str:
    return (
        f"{d.signature!r} is gone from its route on {d.version}, but its error moved: {'; '.join(d.moved)} ({_was(d)})"
    )


def _dropped(d: Decision) -> str:
    assert d.p_value is not None
    seen = f"{d.must_start!r} seen {d.must_seen} time(s)" if d.must_start else "no must-start event promised"
    return (f"{d.signature!r} not seen in {d.after.requests} requests of {d.version} ({_was(d)}): p = {d.p_value:.3g} "
            f"<= {_look(d)} (alpha {d.alpha:g} over {d.looks} looks), floor {d.floor} from the before rate's upper "
            f"bound; {seen}")  # fmt: skip


def _never_seen(d: Decision) -> str:
    return (f"{d.signature!r} was never counted on an earlier build of {d.service} (nothing to show a drop from); "
            f"{d.after.requests} requests of {d.version} without it")  # fmt: skip


def _no_must_start(d: Decision) -> str:
    return (f"{d.signature!r} not seen in {d.after.requests} requests, but {d.must_start!r} never was: no evidence "
            "that the fix ran")  # fmt: skip


def _short(d: Decision) -> str:
    return (f"{d.after.requests} of the {d.needed} requests needed ({_was(d)}; floor {d.floor}, test at {_look(d)}) "
            f"in {d.watch_s:g}s of {d.version}: {d.needed - d.after.requests} more")  # fmt: skip


def _slow(d: Decision) -> str:
    return f"{d.after.count} of {d.after.requests} requests of {d.version} over {d.threshold_ms:g} ms"


def _slow_was(d: Decision) -> str:
    """The regressed build's share (and the baseline's) a latency verdict compares with."""
    was = (f"{d.before.count}/{d.before.requests} on {d.before_version} (regressed)" if d.before is not None
           else f"{d.before_version} (regressed) not seen by this judge")  # fmt: skip
    if d.baseline is not None:
        was += f", {d.baseline.count}/{d.baseline.requests} on {d.baseline_version} (baseline)"
    return was


def _still_slow(d: Decision) -> str:
    assert d.p_still is not None
    return (f"{d.signature!r} still regressed: {_slow(d)}, vs {_slow_was(d)}: slower than the baseline, p = "
            f"{d.p_still:.3g} <= {_look(d)} (alpha {d.alpha:g} over {d.looks} looks)")  # fmt: skip


def _back_to_normal(d: Decision) -> str:
    assert d.p_value is not None
    return (f"{d.signature!r} back to normal: {_slow(d)}, vs {_slow_was(d)}: p = {d.p_value:.3g} <= {_look(d)} (alpha "
            f"{d.alpha:g} over {d.looks} looks), floor {d.needed}")  # fmt: skip


def _nothing_to_drop(d: Decision) -> str:
    return (f"{_slow(d)}; the regressed build's share ({_slow_was(d)}) is not above the baseline's "
            f"{d.baseline_share:.3g}: nothing to show a drop from")  # fmt: skip


def _short_slow(d: Decision) -> str:
    p_text = "n/a" if d.p_value is None else f"{d.p_value:.3g}"
    return (f"{_slow(d)}, vs {_slow_was(d)}: p = {p_text} (test at {_look(d)}) with {d.after.requests} of the "
            f"{d.needed} requests planned in {d.watch_s:g}s")  # fmt: skip


RULES: dict[Rule, Callable[[Decision], str]] = {
    Rule.WORSE: _worse,
    Rule.RECURS: _recurs,
    Rule.MOVED: _moved,
    Rule.DROPPED: _dropped,
    Rule.NEVER_SEEN: _never_seen,
    Rule.NO_MUST_START: _no_must_start,
    Rule.SHORT: _short,
    Rule.STILL_SLOW: _still_slow,
    Rule.BACK_TO_NORMAL: _back_to_normal,
    Rule.NOTHING_TO_DROP: _nothing_to_drop,
    Rule.SHORT_SLOW: _short_slow,
}
