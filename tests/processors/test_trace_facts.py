"""ClosedTrace.facts answers as the per-processor passes it replaced did; processors.model.fast makes the objects
the dataclasses' own __init__ would; a lazy span's detail fields read its detail once, on first use."""

from __future__ import annotations

import random
from dataclasses import FrozenInstanceError, dataclass, field

import pytest

from processors.model.events import Access, DbCall, DbOperation, LockMode, Resource, SpanKind, StatusCode, new_access
from processors.model.fast import maker
from processors.model.sampling import UNKNOWN, Sampling
from processors.model.span import NO_DETAIL, Span, SpanDetail, lazy_span
from processors.model.trace import ClosedTrace
from processors.pipeline.critical_path import critical_path, on_path
from processors.pipeline.requests import Request


def _random_trace(rng: random.Random) -> ClosedTrace:
    """Spans with parents that may be missing, ids that may repeat or be empty, a cycle now and then."""
    n = rng.randint(1, 14)
    ids = [f"{rng.randrange(1, 12):016x}" if rng.random() > 0.05 else "" for _ in range(n)]
    spans = []
    for i in range(n):
        parent = rng.choice(["", "", *ids, f"{99:016x}"])
        start = rng.randrange(0, 50)
        kind = rng.choice(list(SpanKind))
        db = DbCall("postgresql", rng.choice(["", "SELECT 1"])) if rng.random() < 0.3 else None
        spans.append(Span(
            "t" * 32, ids[i], parent, f"op{i % 4}", kind, start, start + rng.randrange(0, 30),
            rng.choice(list(StatusCode)), Resource(rng.choice(["a", "b"])), route=rng.choice(["", "/r"]),
            exception_type=rng.choice(["", "", "ValueError"]), db=db,
            sampling=rng.choice([UNKNOWN, UNKNOWN, Sampling(0.5, "tracestate")]),
        ))  # fmt: skip
    return ClosedTrace("t" * 32, tuple(spans))


def _naive_children_by_end(spans: tuple[Span, ...], start: Span) -> dict[str, list[Span]]:
    children: dict[str, list[Span]] = {}
    for s in spans:
        if s.parent_id and s.span_id != start.span_id:
            children.setdefault(s.parent_id, []).append(s)
    for kids in children.values():
        kids.sort(key=lambda s: s.end_ns, reverse=True)
    return children


def test_facts_answer_as_the_passes_over_the_spans_did() -> None:
    rng = random.Random(7)
    for _ in range(500):
        trace = _random_trace(rng)
        spans, f = trace.spans, trace.facts
        assert trace.facts is f  # made once
        assert trace.root is next((s for s in spans if not s.parent_id), None) or min(spans, key=lambda s: s.start_ns)
        assert (trace.start_ns, trace.end_ns) == (min(s.start_ns for s in spans), max(s.end_ns for s in spans))
        assert f.by_id == {s.span_id: s for s in spans} and f.unique == (len({s.span_id for s in spans}) == len(spans))
        assert f.error == any(s.is_error for s in spans)
        assert f.exception == next((s.exception_type for s in spans if s.exception_type), "")
        assert f.db == [s for s in spans if s.db is not None]
        assert f.clients == [s for s in spans if s.kind == SpanKind.CLIENT]
        assert f.requests == [s for s in spans if s.kind == SpanKind.SERVER or not s.parent_id]
        assert f.servers == {s.parent_id: s for s in spans if s.kind == SpanKind.SERVER and s.parent_id}
        children: dict[str, list[Span]] = {}
        for s in spans:
            children.setdefault(s.parent_id, []).append(s)
        assert f.children == children
        root_sampling = trace.root.sampling
        assert f.sampling == (root_sampling if root_sampling.source else
                              next((s.sampling for s in spans if s.sampling.source), UNKNOWN))  # fmt: skip
        for start in spans:  # the shared children (latest end first) walk as the walk's own did
            own = _naive_children_by_end(spans, start)
            assert (
                critical_path(spans, start, f.by_end) == critical_path(spans, start, own) == critical_path(spans, start)
            )
            assert on_path(spans, start, f.by_end) == on_path(spans, start)


def test_a_trace_without_spans_has_no_root_start_or_end() -> None:
    trace = ClosedTrace("t" * 32, ())
    for read in (lambda: trace.root, lambda: trace.start_ns, lambda: trace.end_ns):
        with pytest.raises(ValueError):
            read()


def test_the_facts_are_no_part_of_a_trace_s_value() -> None:
    trace = _random_trace(random.Random(1))
    twin = ClosedTrace(trace.trace_id, trace.spans)
    assert trace.facts is not None and twin == trace and hash(twin) == hash(trace)
    assert "facts" not in repr(trace)


@dataclass(frozen=True, slots=True)
class Call:
    """A frozen slotted dataclass with a tuple field (the shape of the hang detector's former per-call object)."""

    hop: tuple[str, str, str]
    version: str
    trace_id: str
    start_ns: int
    end_ns: int
    error: bool
    timeout: bool
    answered: bool


def test_maker_makes_what_the_constructor_makes() -> None:
    args = ("orders:1", "orders", DbOperation.WRITE, LockMode.NONE, "t" * 32, "s" * 16, "shop", "1", 5, 9, "UPDATE")
    for made, real in [
        (new_access(*args), Access(*args)),
        (new_access(*args, error=True, links=("x",)), Access(*args, error=True, links=("x",))),
        (maker(Request)("t", "s", "a", "1", "", "/r", "GET /r", 1, 2, False), Request("t", "s", "a", "1", "", "/r",
                                                                                        "GET /r", 1, 2, False)),
        (maker(Call)(("a", "b", "c"), "1", "t", 1, 2, False, False, True), Call(("a", "b", "c"), "1", "t", 1, 2,
                                                                               False, False, True)),
    ]:  # fmt: skip
        assert type(made) is type(real) and made == real and hash(made) == hash(real) and repr(made) == repr(real)
    access = new_access(*args)
    with pytest.raises(FrozenInstanceError):
        access.error = True  # type: ignore[misc]
    with pytest.raises(TypeError):
        new_access(*args[:3])  # as Access(...): the fields without a default are required


def test_maker_refuses_what_it_cannot_make_alike() -> None:
    @dataclass(slots=True)
    class Open:
        a: int

    @dataclass(frozen=True, slots=True)
    class Factory:
        a: list[int] = field(default_factory=list)

    @dataclass(frozen=True)
    class NoSlots:
        a: int

    for cls in (Open, Factory, NoSlots):
        with pytest.raises(TypeError):
            maker(cls)


class _Reader:
    def __init__(self) -> None:
        self.reads = 0

    def span_detail(self, source: object) -> SpanDetail:
        self.reads += 1
        return NO_DETAIL._replace(route=str(source), db=DbCall("postgresql", "SELECT 1"))


def test_detail_fields_of_a_lazy_span_read_its_detail_once() -> None:
    reader = _Reader()
    span = lazy_span("t" * 32, "s" * 16, "", "GET /x", SpanKind.SERVER, 1, 2, StatusCode.OK, Resource("a"), reader,
                     "/x")  # fmt: skip
    assert span.route == "/x" and reader.reads == 1
    assert span.db == DbCall("postgresql", "SELECT 1") and span.http_status == 0 and reader.reads == 1
    with pytest.raises(AttributeError):
        span.no_such_field  # type: ignore[attr-defined]  # noqa: B018
    other = lazy_span("t" * 32, "s" * 16, "", "GET /x", SpanKind.SERVER, 1, 2, StatusCode.OK, Resource("a"),
                      _Reader(), "/x")  # fmt: skip
    assert other.detail.route == "/x" and other == span
