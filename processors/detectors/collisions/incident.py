"""From a :class:`Collision` to the published :class:`IncidentEvent`."""

from __future__ import annotations

from processors.detectors.collisions.views import Collision
from processors.graph.rows import clean
from processors.model.anomaly import title
from processors.model.events import Access, Commit, Keying
from processors.model.outputs import AccessInfo, CommitInfo, IncidentEvent
from processors.sql.values import predicate_text


def _access(a: Access, origin_ns: int) -> AccessInfo:
    return AccessInfo(
        trace_id=a.trace_id,
        span_id=a.span_id,
        service=a.service,
        version=a.version,
        function=a.function,
        file=a.file,
        route=a.route,
        operation=a.operation.value,
        lock=a.lock.value,
        statement=a.statement,
        params=[clean(p) for p in a.params],
        set_values={k: clean(v) for k, v in a.set_values},
        start_unix_ms=a.start_ns / 1e6,
        offset_ms=round((a.start_ns - origin_ns) / 1e6, 3),
        error=a.error or a.trace_error,
        exception=a.trace_exception,
        http_status=a.trace_status,
        entity=a.entity,
        predicate="" if a.keyed else predicate_text(a.predicates, a.exact, a.where),
        idempotency_key=a.idempotency_key,
        line=a.line,
        located_by=a.located_by,
        candidates=list(a.candidates),
        keying=a.keying,
        key_candidates=a.key_candidates,
        key_confidence=a.key_confidence,
        sampling=a.trace_sampling,
    )


def _commit(c: Commit, origin_ns: int) -> CommitInfo:
    ch = c.change
    return CommitInfo(
        lsn=ch.lsn,
        tx_id=ch.tx_id,
        commit_unix_ms=ch.commit_ts_ms,
        offset_ms=round(ch.commit_ts_ms - origin_ns / 1e6, 3),
        op=ch.op.value,
        before=ch.before,
        after=ch.after,
        trace_id=c.trace_id,
        span_id=c.span_id,
        correlation=c.strength,
        skew_ms=c.skew_ms,
    )


def keying_evidence(c: Collision) -> list[str]:
    """What of the incident is inferred, and how sure: the statements whose row was not on their span, and the row
    changes credited by less than an id."""
    lines = []
    for a in dict.fromkeys((c.culprit, c.victim, *c.accesses)):
        who = f"{a.function or a.service} ({a.trace_id[:8]}): {a.statement}"
        if a.keying in (Keying.BY_CHANGE, Keying.BY_TRACE):
            how = "the row change credited to it" if a.keying == Keying.BY_CHANGE else "a later write of its trace"
            of = f" ({a.key_candidates} candidate rows, agreeing on them)" if a.key_candidates > 1 else ""
            what = f"the row of {who} is {a.entity}" if a.keyed else (
                f"the values of {who} are {predicate_text(a.predicates, a.exact)}")  # fmt: skip
            lines.append(f"inferred ({a.keying}, confidence {a.key_confidence:.2f}): {what}, from {how}{of}; its "
                         f"parameters are not on its span")  # fmt: skip
        elif a.keying == Keying.PREDICATE and (a.unbound or a.unbound_key):
            lines.append(f"undecided (predicate): {who} may match the rows of {a.table}; the values of "
                         f"{', '.join(sorted({col for col, _ in a.unbound}))} are not on its span")  # fmt: skip
    lines += [f"inferred (correlation {x.strength}): the writer of lsn {x.change.lsn} is trace {x.trace_id[:8]}"
              for x in c.commits if x.strength in ("commit_order", "tx_order", "tied")]  # fmt: skip
    return lines


def summary(c: Collision) -> str:
    who = f"{c.culprit.function or c.culprit.service} ({c.culprit.route})"
    victim = f"{c.victim.function or c.victim.service} ({c.victim.route})"
    gap = (c.victim.start_ns - c.culprit.start_ns) / 1e6
    state = "manifest" if c.manifest else "latent"
    where = " and ".join(c.entities) if len(c.entities) > 1 else c.entity
    return f"{title(c.anomaly)} on {where}: {who} wrote first, {victim} {gap:+.1f} ms ({state})"


def incident_event(c: Collision, watermark_ns: int) -> IncidentEvent:
    origin = c.culprit.start_ns
    return IncidentEvent(
        fingerprint=c.fingerprint,
        occurrence=c.occurrence,
        anomaly=c.anomaly,
        severity="high" if c.manifest else "low",
        manifest=c.manifest,
        entity=c.entity,
        table=c.table,
        window_ms=round(c.window_ms, 3),
        summary=summary(c),
        damage=c.damage,
        confidence=c.confidence,
        culprit=_access(c.culprit, origin),
        victim=_access(c.victim, origin),
        writers=[_access(a, origin) for a in c.writers],
        accesses=[_access(a, origin) for a in c.accesses],
        commits=[_commit(x, origin) for x in c.commits],
        evidence=[*c.evidence, *keying_evidence(c), *sampling_evidence(c)],
        detected_at_unix_ms=watermark_ns / 1e6,
        adya=c.adya,
        entities=list(c.entities or (c.entity,)),
        correlated=c.correlated,
        invariant=c.invariant,
        pair_probability=_kept(c.culprit) * _kept(c.victim),
        pair_sampling_known=c.culprit.trace_sampling is not None and c.victim.trace_sampling is not None,
    )


def _kept(a: Access) -> float:
    return 1.0 if a.trace_sampling is None else a.trace_sampling


def sampling_evidence(c: Collision) -> list[str]:
    """What sampling hides: a line when either party's trace was kept with a probability below 1, or one's is stated
    and the other's unknown, with the chance a pair like this one is observed."""
    p1, p2 = c.culprit.trace_sampling, c.victim.trace_sampling
    if (p1 is None and p2 is None) or (p1 == 1.0 and p2 == 1.0):
        return []
    pair = _kept(c.culprit) * _kept(c.victim)
    unknown = p1 is None or p2 is None
    seen = f"about {1 / pair:.3g} such collisions per one seen" if pair > 0 else "none is ever seen"
    bound = " at most (unknown counted as 1)" if unknown else ""
    return [f"sampling: the culprit's trace was kept with probability {_label(p1)}, the victim's with {_label(p2)}; "
            f"a pair like this is observed with probability {pair:.3g}{bound}: {seen}"]  # fmt: skip


def _label(p: float | None) -> str:
    return "unknown" if p is None else f"{p:g}"
