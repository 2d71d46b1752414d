"""A finding of a type no sink knows (registered here, as a detector registers its own): what the sinks, the graph
and MCP must handle through the ``Finding`` interface alone."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import Enum
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from processors.model.base import Frozen
from processors.model.finding import ContractRules, FindingEvent, FindingType, Point, Series, Subject, register_type

T0 = 1_800_000_000_000.0  # ms


class HangData(Frozen):
    """The sample type's data: the damage as values."""

    calls: int
    hung: int
    p95_ms: float
    dependency: str


SAMPLE_TYPE = FindingType(
    name="sample_hang",
    title="Hang (sample)",
    description="calls to a dependency that end far beyond their distribution without an error",
    data=HangData,
    remedies=("add_timeout", "circuit_breaker"),
)
register_type(SAMPLE_TYPE)


def finding(occurrence: str = "occ-1", at_ms: float = T0, **changes: Any) -> FindingEvent:
    """One occurrence of the sample type's defect at ``at_ms`` (fields replaced by ``changes``)."""
    fields: dict[str, Any] = {
        "fingerprint": "fp-sample-hang",
        "occurrence": occurrence,
        "detected_at_unix_ms": at_ms + 60_000,
        "type": SAMPLE_TYPE.name,
        "title": "GET /checkout hangs on payments: 20 of 320 calls",
        "subject": Subject(service="checkout", operation="GET /checkout", entity="payments", version="1.4.2"),
        "severity": "high",
        "remedy": "add_timeout",
        "evidence": ["20 of 320 calls to payments ended after 30 s without an error", "no client timeout set"],
        "data": {"calls": 320, "hung": 20, "p95_ms": 30_012.5, "dependency": "payments"},
        "series": [
            Series(
                name="Latency of calls to payments",
                x_label="minute",
                y_label="p95 (ms)",
                points=[Point(x=0, y=41.0), Point(x=1, y=30_012.5), Point(x=2, y=29_870.0)],
            ),
        ],
        "traces": ["ab" * 16, "cd" * 16],
        "first_seen_unix_ms": at_ms,
        "last_seen_unix_ms": at_ms + 30_000,
        "contract": ContractRules(signature="sample_hang:fp-sample-hang", service="checkout", routes=["GET /checkout"]),
    }
    return FindingEvent.model_validate({**fields, **changes})


# ---- a sample of any registered type (the conformance test) -----------------------------------------------------

_SCALARS: dict[Any, tuple[Any, ...]] = {int: (1, 2, 0), float: (1.0, 0.5, 0.0), str: ("x", "sample"), bool: (True,)}


def _candidates(annotation: Any) -> list[Any]:
    """Values to try for one field of a data model (its type's plain values; nested models built the same way)."""
    origin = get_origin(annotation)
    if origin is Literal:
        return list(get_args(annotation))
    if origin in (Union, UnionType):
        return [v for arg in get_args(annotation) if arg is not type(None) for v in _candidates(arg)] + [None]
    if origin is Annotated:
        return _candidates(get_args(annotation)[0])
    if origin in (list, tuple, set, frozenset, Sequence):
        inner = get_args(annotation)[0] if get_args(annotation) else str
        return [[], *([[v] for v in _candidates(inner)[:1]])]
    if origin in (dict, Mapping):
        return [{}]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [example_data(annotation)]
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return [next(iter(annotation)).value]
    return list(_SCALARS.get(annotation, ("x", 1, 1.0)))


def _bounded(annotation: Any, metadata: list[Any]) -> list[Any]:
    """Values at a field's declared bounds (``ge``, ``gt``, ``le``, ``lt``, ``min_length``), to try first."""
    out: list[Any] = []
    for m in metadata:
        for attr, step in (("ge", 0), ("gt", 1), ("le", 0), ("lt", -1)):
            bound = getattr(m, attr, None)
            if isinstance(bound, int | float):
                out.append(type(bound)(bound + (step if annotation is int else step / 2)))
        size = getattr(m, "min_length", None)
        if isinstance(size, int):
            plain = [v for v in _candidates(annotation) if v]
            if plain and isinstance(plain[0], str | list):
                out.append(plain[0] * size)
    return out


def example_data(model: type[BaseModel]) -> dict[str, Any]:
    """Data that validates against ``model``: each required field from the first of its type's plain values the model
    accepts (defaults kept). Raises ``ValueError`` when none of them validates."""
    data: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        if not field.is_required():
            continue
        for value in [*_bounded(field.annotation, field.metadata), *_candidates(field.annotation)]:
            try:
                model.model_validate({**data, name: value}, strict=False)
            except ValidationError as exc:
                if any(err["loc"][:1] == (name,) for err in exc.errors()):
                    continue  # this value is wrong for the field (the other fields are still missing)
            data[name] = value
            break
        else:
            raise ValueError(f"no plain value of {field.annotation} validates {model.__name__}.{name}")
    model.model_validate(data)
    return data


def sample_of(finding_type: FindingType, fingerprint: str, at_ms: float = T0) -> FindingEvent:
    """One finding of a registered type, with data its model accepts and a remedy it lists."""
    data = example_data(finding_type.data) if finding_type.data is not None else {}
    return finding(occurrence=f"occ-{fingerprint}", at_ms=at_ms, fingerprint=fingerprint, type=finding_type.name,
                   title=f"conformance sample of {finding_type.name}", data=data,
                   remedy=finding_type.remedies[0] if finding_type.remedies else "",
                   contract=ContractRules(signature=f"{finding_type.name}:{fingerprint}", service="checkout",
                                          routes=["GET /checkout"]))  # fmt: skip
