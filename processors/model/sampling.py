"""The sampling a span was kept under: its probability, where that was read from, or that it is unknown.

Read from, in order:

* the W3C ``tracestate`` OpenTelemetry entry (the OTel spec "TraceState: Probability Sampling", OTEP 235):
  ``ot=th:<hex>`` is the rejection threshold, 1 to 14 lowercase hex digits padded on the right with zeros to 56
  bits, so the probability is ``1 - th / 2**56`` (``th:0``: always kept); ``rv:<14 hex>`` is an explicit
  randomness value (kept as text: it says nothing of the probability). The older draft's ``ot=p:<n>`` (OTEP 168,
  power-of-two probability ``2**-n``, ``p:63`` = never) is read when ``th`` is absent;
* the attributes Jaeger clients set on a trace's root span: ``sampler.type`` ``const`` (``sampler.param`` 1: kept
  always) or ``probabilistic`` (``sampler.param`` the probability); other types (``ratelimiting``, ``lowerbound``,
  ``remote``) say a sampler was at work but not with which probability: unknown, with the type as the source.

Nothing read: the probability is unknown (``None``), which is not the same as 1.0 (``th:0``, ``const``): an SDK's
``TraceIdRatioBased`` sampler of older releases keeps a fraction of traces without writing any tracestate. Unknown
counts as 1.0 where a weight is needed (``weight``), and is shown as ``unknown``.

Hostile text is data: the tracestate read is bounded (``MAX_TRACESTATE``), anything malformed reads as unknown.
"""

from __future__ import annotations

from typing import Any, NamedTuple

MAX_TRACESTATE = 1024  # characters of tracestate read (W3C bounds it to 512; a longer one is not trusted further)
_THRESHOLD_BITS = 56
_MAX_THRESHOLD = 1 << _THRESHOLD_BITS
_HEX = frozenset("0123456789abcdef")
UNKNOWN_LABEL = "unknown"


class Sampling(NamedTuple):
    """The probability a span's trace was kept with (``None``: unknown) and what said so."""

    probability: float | None = None
    source: str = ""  # "tracestate" | "tracestate_p" | "jaeger" | "jaeger:<type>" | "" (nothing read)

    @property
    def label(self) -> str:
        """The probability as receipts and metrics show it (``%g``), or ``unknown``."""
        return UNKNOWN_LABEL if self.probability is None else f"{self.probability:g}"

    @property
    def weight(self) -> float:
        """The traces this one represents (its adjusted count, ``1 / p``): 1.0 when unknown, 0.0 for ``p = 0``."""
        p = self.probability
        return 1.0 if p is None else (1.0 / p if p > 0 else 0.0)


UNKNOWN = Sampling()


def threshold_probability(th: str) -> float | None:
    """The probability of an OTEP 235 threshold ``th`` (1 to 14 lowercase hex digits); None when malformed."""
    if not 1 <= len(th) <= _THRESHOLD_BITS // 4 or not _HEX.issuperset(th):
        return None
    threshold = int(th.ljust(_THRESHOLD_BITS // 4, "0"), 16)
    return (_MAX_THRESHOLD - threshold) / _MAX_THRESHOLD


def _p_value_probability(p: str) -> float | None:
    """The probability of an OTEP 168 ``p`` value (0..63, 63: never); None when malformed."""
    if not p.isascii() or not p.isdigit() or len(p) > 2 or int(p) > 63:
        return None
    return 0.0 if int(p) == 63 else 2.0 ** -int(p)


def ot_entry(tracestate: str) -> dict[str, str]:
    """The sub-keys of the ``ot`` member of a W3C tracestate (``{}`` when absent or malformed)."""
    for member in tracestate[:MAX_TRACESTATE].split(","):
        key, sep, value = member.strip(" \t").partition("=")
        if sep and key == "ot":
            out: dict[str, str] = {}
            for item in value.split(";"):
                k, colon, v = item.partition(":")
                if colon and k not in out:
                    out[k] = v
            return out
    return {}


def from_tracestate(tracestate: str) -> Sampling:
    """The sampling a tracestate states (``UNKNOWN`` when it states none, or states it malformed)."""
    if "ot=" not in tracestate[:MAX_TRACESTATE]:
        return UNKNOWN
    ot = ot_entry(tracestate)
    if "th" in ot:
        p = threshold_probability(ot["th"])
        return UNKNOWN if p is None else Sampling(p, "tracestate")
    if "p" in ot:
        p = _p_value_probability(ot["p"])
        return UNKNOWN if p is None else Sampling(p, "tracestate_p")
    return UNKNOWN


def from_jaeger(sampler_type: Any, sampler_param: Any) -> Sampling:
    """The sampling Jaeger's ``sampler.type`` / ``sampler.param`` attributes state (``UNKNOWN`` when none)."""
    if not isinstance(sampler_type, str) or not sampler_type:
        return UNKNOWN
    kind = sampler_type[:32]
    param: float | None = None
    if isinstance(sampler_param, bool):
        param = 1.0 if sampler_param else 0.0
    elif isinstance(sampler_param, int | float):
        param = float(sampler_param)
    elif isinstance(sampler_param, str):
        try:
            param = float(sampler_param[:32])
        except ValueError:
            param = None
    if param is not None and not 0.0 <= param <= 1.0:  # NaN fails both comparisons
        param = None
    if kind == "const" and param is not None:
        return Sampling(1.0 if param else 0.0, "jaeger")
    if kind == "probabilistic" and param is not None:
        return Sampling(param, "jaeger")
    return Sampling(None, f"jaeger:{kind}")


def span_sampling(tracestate: str, sampler_type: Any = None, sampler_param: Any = None) -> Sampling:
    """A span's sampling: its tracestate's when it states one, else its Jaeger sampler attributes'."""
    found = from_tracestate(tracestate) if tracestate else UNKNOWN
    if found.probability is None and sampler_type is not None:
        jaeger = from_jaeger(sampler_type, sampler_param)
        if jaeger.source:
            return jaeger
    return found
