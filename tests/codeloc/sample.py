"""Small checkouts written as text, and the spans a stock instrumentation records (no ``code.*``), for the locator."""

from __future__ import annotations

import textwrap
from pathlib import Path

from processors.api.telemetry import Telemetry
from processors.codeloc import CodeLocator, CodeLocConfig
from processors.model.events import DbCall, Resource, SpanKind, StatusCode
from processors.model.span import Span
from processors.model.trace import ClosedTrace

MS = 1_000_000
T = "ab" * 16


def checkout(root: Path, files: dict[str, str]) -> Path:
    """Write ``files`` (relative path -> source, dedented) under ``root``."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    return root


def line_of(root: Path, rel: str, needle: str) -> int:
    """The 1-based line of ``rel`` that holds ``needle`` (exactly one)."""
    lines = [i for i, line in enumerate((root / rel).read_text().splitlines(), 1) if needle in line]
    assert len(lines) == 1, (needle, lines)
    return lines[0]


def locator(root: Path, telemetry: Telemetry | None = None, **config: object) -> CodeLocator:
    loc = CodeLocator(CodeLocConfig(source_root=str(root), **config), root, telemetry or Telemetry("codeloc"))  # type: ignore[arg-type]
    loc.prepare()
    return loc


def server(sid: int, method: str, route: str, *, service: str = "shop", **kw: object) -> Span:
    """A server span as the Flask / FastAPI / Django instrumentations name it: ``<METHOD> <route>``."""
    return Span(trace_id=T, span_id=f"{sid:016x}", parent_id="", name=f"{method} {route}", kind=SpanKind.SERVER,
                start_ns=1_000 * MS, end_ns=1_100 * MS, status=kw.pop("status", StatusCode.UNSET),  # type: ignore[arg-type]
                resource=Resource(service), route=route, **kw)  # type: ignore[arg-type]  # fmt: skip


def client(sid: int, parent: int, statement: str, *, service: str = "shop", error: bool = False,
           params: tuple[object, ...] = ()) -> Span:  # fmt: skip
    """A DB client span of a stock driver instrumentation: the statement, no parameters, no ``code.*``."""
    return Span(trace_id=T, span_id=f"{sid:016x}", parent_id=f"{parent:016x}", name=statement.split()[0],
                kind=SpanKind.CLIENT, start_ns=(1_000 + sid) * MS, end_ns=(1_001 + sid) * MS,
                status=StatusCode.ERROR if error else StatusCode.UNSET, resource=Resource(service),
                db=DbCall("postgresql", statement, params=params))  # type: ignore[arg-type]  # fmt: skip


def trace(*spans: Span) -> ClosedTrace:
    return ClosedTrace(T, spans)
