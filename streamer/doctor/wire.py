"""What the OTLP wire carries beside the decoded span fields, per service: the SDK's language, the instrumentation
scopes, and the sampling the spans say they went through.

The daemon's decoders keep only what the processors need, so the doctor reads these few fields from the sampled
messages itself: ``telemetry.sdk.language`` (to name the fix in the service's own language), the scope names (the
SQLAlchemy instrumentation has no parameter option, the driver's has), a W3C ``tracestate`` OpenTelemetry threshold
(``ot=th:<hex>``, the consistent-probability sampling the SDK or collector applied) and sampler attributes
(``sampler.type`` / ``sampler.param`` as Jaeger's SDKs record them, ``sampling.*``).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError as ProtoDecodeError  # type: ignore[import-untyped]
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

MAX_DISTINCT = 16  # scopes and thresholds kept per service (the rest counted only)
SAMPLER_PREFIXES = ("sampler.", "sampling.")


@dataclass(slots=True)
class WireFacts:
    """One service's facts from the raw messages."""

    language: str = ""
    scopes: set[str] = field(default_factory=set)
    spans: int = 0
    with_threshold: int = 0
    thresholds: Counter[str] = field(default_factory=Counter)
    sampler_attributes: Counter[str] = field(default_factory=Counter)


def threshold(trace_state: str) -> str:
    """The ``th`` of the ``ot`` entry of a W3C tracestate (``ot=th:8;rv:...`` -> ``8``), or ""."""
    for member in trace_state.split(","):
        key, _, value = member.strip().partition("=")
        if key == "ot":
            for part in value.split(";"):
                name, _, th = part.partition(":")
                if name == "th":
                    return th
    return ""


class WireCensus:
    """Sums the raw facts of span messages per service (``service.name``)."""

    def __init__(self) -> None:
        self.services: dict[str, WireFacts] = {}

    def _facts(self, service: str) -> WireFacts:
        return self.services.setdefault(service, WireFacts())

    def _span(self, facts: WireFacts, trace_state: str, keys: list[str]) -> None:
        facts.spans += 1
        th = threshold(trace_state)
        if th:
            facts.with_threshold += 1
            if th in facts.thresholds or len(facts.thresholds) < MAX_DISTINCT:
                facts.thresholds[th] += 1
        for key in keys:
            if key.startswith(SAMPLER_PREFIXES) and (key in facts.sampler_attributes
                                                     or len(facts.sampler_attributes) < MAX_DISTINCT):  # fmt: skip
                facts.sampler_attributes[key] += 1

    def add_proto(self, value: bytes) -> None:
        """A ``TracesData`` message (``otlp_proto``); one that does not parse adds nothing (the decoder counts it)."""
        data = TracesData()
        try:
            data.ParseFromString(value)
        except ProtoDecodeError:
            return
        for rs in data.resource_spans:
            attrs = {a.key: a.value.string_value for a in rs.resource.attributes}
            facts = self._facts(attrs.get("service.name", ""))
            facts.language = facts.language or attrs.get("telemetry.sdk.language", "")
            for ss in rs.scope_spans:
                if ss.scope.name and len(facts.scopes) < MAX_DISTINCT:
                    facts.scopes.add(ss.scope.name)
                for span in ss.spans:
                    self._span(facts, span.trace_state, [a.key for a in span.attributes])

    def add_json(self, value: bytes) -> None:
        """An OTLP/JSON traces message (``otlp_json``); one that does not parse adds nothing."""
        try:
            doc = json.loads(value)
        except ValueError:
            return
        for rs in _list(doc, "resourceSpans"):
            attrs = {a.get("key"): (a.get("value") or {}).get("stringValue", "")
                     for a in _list(rs.get("resource") or {}, "attributes") if isinstance(a, dict)}  # fmt: skip
            facts = self._facts(str(attrs.get("service.name", "")))
            facts.language = facts.language or str(attrs.get("telemetry.sdk.language", ""))
            for ss in _list(rs, "scopeSpans"):
                name = (ss.get("scope") or {}).get("name")
                if isinstance(name, str) and name and len(facts.scopes) < MAX_DISTINCT:
                    facts.scopes.add(name)
                for span in _list(ss, "spans"):
                    keys = [str(a.get("key")) for a in _list(span, "attributes") if isinstance(a, dict)]
                    self._span(facts, str(span.get("traceState") or ""), keys)


def _list(obj: Any, key: str) -> list[Any]:
    value = obj.get(key) if isinstance(obj, dict) else None
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []
