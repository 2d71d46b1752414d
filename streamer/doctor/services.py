"""Per service: what the decoded spans carry for each capability, and the findings with their fixes.

Statements go through the daemon's own SQL access extractor: a statement is *unbound* when it names rows or values
through placeholders whose values the span does not carry (stock instrumentation records none). The daemon still
finds the rows, from the row changes Debezium reports, at a lower confidence; the fix is to record the parameters.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from processors.codeloc import CodeLocConfig
from processors.model.events import Access, DbOperation, SpanKind
from processors.model.span import Span
from processors.sql import SqlAccessExtractor
from streamer.doctor import fixes
from streamer.doctor.report import Finding, Status
from streamer.doctor.wire import WireFacts

MAX_VERSIONS = 16


@dataclass(slots=True)
class ServiceStats:
    """What one service's sampled spans carried."""

    spans: int = 0
    statements: int = 0  # DB spans whose statement reads or writes rows
    unbound: int = 0  # ... of which the span lacks placeholders' values
    unbound_tables: Counter[str] = field(default_factory=Counter)
    tables: Counter[str] = field(default_factory=Counter)  # statements per table (no schema)
    written: set[str] = field(default_factory=set)  # tables (no schema) the service writes
    versions: Counter[str] = field(default_factory=Counter)  # service.version ("" = none) -> spans
    server: int = 0
    server_with_route: int = 0
    with_code: int = 0


def unbound(access: Access) -> bool:
    """Whether the span lacks values the statement's placeholders stand for (in its WHERE, SET or VALUES)."""
    return bool(access.unbound) or access.unbound_key or len(access.set_values) < len(access.set_columns)


class ServiceCensus:
    """Sums decoded spans per service (``service.name``)."""

    def __init__(self, extractor: SqlAccessExtractor | None = None) -> None:
        self.extractor = extractor or SqlAccessExtractor()
        self.services: dict[str, ServiceStats] = {}

    def add(self, span: Span) -> None:
        s = self.services.setdefault(span.resource.service, ServiceStats())
        s.spans += 1
        version = span.resource.version
        if version in s.versions or len(s.versions) < MAX_VERSIONS:
            s.versions[version] += 1
        if span.kind == SpanKind.SERVER:
            s.server += 1
            s.server_with_route += bool(span.route)
        s.with_code += bool(span.code_function or span.code_file)
        if span.db is None:
            return
        accesses = self.extractor.accesses(span)
        if not accesses:
            return
        s.statements += 1
        s.tables.update({a.table for a in accesses})
        if any(unbound(a) for a in accesses):
            s.unbound += 1
            s.unbound_tables.update({a.table for a in accesses})
        s.written.update(a.table for a in accesses if a.operation is not DbOperation.READ)


def _share(part: int, whole: int) -> Status:
    return Status.OK if part == whole else Status.MISSING if part == 0 else Status.PARTIAL


def findings(name: str, s: ServiceStats, wire: WireFacts | None, codeloc: CodeLocConfig) -> list[Finding]:
    """The findings of one service, each with the fix in the service's language (all four when it is unknown)."""
    subject = f"service {name or '(no service.name)'}"
    language = wire.language if wire else ""
    out: list[Finding] = []
    if s.statements:
        tables = ", ".join(t for t, _ in s.unbound_tables.most_common())
        bound = s.statements - s.unbound
        detail = (f"{s.unbound} of {s.statements} statement(s) carry no parameter values ({tables}): rows are inferred "
                  "from the row changes, at lower confidence" if s.unbound else
                  f"{s.statements} statement(s), every one with its parameter values")  # fmt: skip
        scopes = " ".join(sorted(wire.scopes)).lower() if wire else ""
        sqlalchemy_only = "sqlalchemy" in scopes and "psycopg" not in scopes and "dbapi" not in scopes
        fix = fixes.PARAMETERS_SQLALCHEMY if sqlalchemy_only else fixes.by_language(fixes.PARAMETERS, language)
        out.append(Finding(subject, "collisions: statement parameters", _share(bound, s.statements), detail, fix))
    versions = {v: n for v, n in s.versions.items() if v}
    with_version = sum(versions.values())
    detail = f"service.version {', '.join(sorted(versions))}" if versions else "no service.version on the resource"
    if with_version and with_version < s.spans:
        detail += f"; {s.spans - with_version} of {s.spans} span(s) without it"
    out.append(Finding(subject, "regressions, verdicts: service.version", _share(with_version, s.spans), detail,
                       fixes.VERSION))  # fmt: skip
    route_fix = fixes.by_language(fixes.ROUTES, language, fixes.ROUTES_ANY)
    if s.server:
        detail = f"{s.server_with_route} of {s.server} server span(s) carry http.route"
        out.append(Finding(subject, "routes: http.route", _share(s.server_with_route, s.server), detail, route_fix))
    else:
        detail = "no server span in the sample: requests are named by their root span"
        out.append(Finding(subject, "routes: http.route", Status.PARTIAL, detail, route_fix))
    checkout = bool(codeloc.source_root) or name in codeloc.services
    if s.with_code:
        code = Finding(subject, "repairs: code location", Status.OK, f"{s.with_code} span(s) carry code.*")
    elif checkout:
        code = Finding(subject, "repairs: code location", Status.OK, "no code.* on the spans; a [codeloc] checkout")
    else:
        code = Finding(subject, "repairs: code location", Status.MISSING, "no code.* and no [codeloc] checkout",
                       fixes.CODE)  # fmt: skip
    out.append(code)
    if wire is not None and wire.spans:
        out.append(_sampling(subject, wire))
    return out


def _sampling(subject: str, wire: WireFacts) -> Finding:
    what = "sampling: threshold or sampler"
    if wire.with_threshold:
        ths = ", ".join(f"th:{t}" for t in sorted(wire.thresholds))
        status = Status.OK if wire.with_threshold == wire.spans else Status.PARTIAL
        return Finding(subject, what, status, f"{wire.with_threshold} of {wire.spans} span(s) carry tracestate "
                       f"ot={ths}", fixes.SAMPLING)  # fmt: skip
    if wire.sampler_attributes:
        keys = ", ".join(sorted(wire.sampler_attributes))
        return Finding(subject, what, Status.OK, f"sampler attributes {keys}")
    return Finding(subject, what, Status.PARTIAL, "no sampling information on the spans: every trace is taken as "
                   "kept (a head sampler that drops writers hides collisions)", fixes.SAMPLING)  # fmt: skip


def table_parameters(census: ServiceCensus, subjects: dict[str, str]) -> list[Finding]:
    """Per table the statements touch: how many of them carry no parameter values, and from which services.
    ``subjects`` names a table's subject by its bare name (a captured table's CDC subject)."""
    out = []
    for table in sorted({t for s in census.services.values() for t in s.tables}):
        total = sum(s.tables[table] for s in census.services.values())
        lacking = {name: s.unbound_tables[table] for name, s in census.services.items() if s.unbound_tables[table]}
        n = sum(lacking.values())
        detail = (f"{n} of {total} statement(s) on it carry no parameter values (from "
                  f"{', '.join(sorted(lacking))}): its rows are inferred from its row changes" if n else
                  f"{total} statement(s) on it, every one with its parameter values")  # fmt: skip
        fix = "record the statements' parameters in those services (see each service's fix)" if n else ""
        out.append(Finding(subjects.get(table, f"table {table}"), "collisions: statement parameters",
                           _share(total - n, total), detail, fix))  # fmt: skip
    return out
