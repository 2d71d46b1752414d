"""Typed, frozen events: what decoders produce and processors consume.

Hot-path events (one per span, per log record, per row change) are slotted frozen dataclasses, not pydantic
models: the daemon builds ~50k of them a second and validation already happened in the decoder. Output events
that leave the process (incidents, repros, verdicts, dead letters) are pydantic models in
``processors.model.outputs`` with a ``schema_version`` field.

Times are integers in nanoseconds since the Unix epoch (``*_ns``), as OTLP carries them; Debezium's
millisecond times are kept in milliseconds (``*_ms``) and converted where compared.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field, fields
from enum import IntEnum, StrEnum
from typing import Any

from typing_extensions import TypeAliasType

from processors.model.fast import maker
from processors.model.units import MS_NS

# A scalar value as it appears in span attributes, statement parameters and row images.
Scalar = str | int | float | bool | None
# A whole WHERE evaluable on row images (``processors.sql.predicate``): its tree of tuples (an operator's name, then
# its operands), and per placeholder () or (value,). Tuples all the way down: an ``Access`` stays hashable.
PredicateNode = TypeAliasType("PredicateNode", "tuple[PredicateNode | Scalar, ...]")
Predicate = tuple[PredicateNode, tuple[tuple[Scalar, ...], ...]]


class SpanKind(IntEnum):
    """OTLP ``Span.SpanKind`` values."""

    UNSPECIFIED = 0
    INTERNAL = 1
    SERVER = 2
    CLIENT = 3
    PRODUCER = 4
    CONSUMER = 5


class StatusCode(IntEnum):
    """OTLP ``Status.StatusCode`` values."""

    UNSET = 0
    OK = 1
    ERROR = 2


class DbOperation(StrEnum):
    """What a statement does to the rows it names."""

    READ = "read"
    WRITE = "write"
    INSERT = "insert"
    DELETE = "delete"


class LockMode(StrEnum):
    """How a statement protects the rows it touches against concurrent writers."""

    NONE = "none"
    FOR_UPDATE = "for_update"
    FOR_SHARE = "for_share"
    OPTIMISTIC = "optimistic"  # UPDATE ... WHERE version = ?
    ATOMIC = "atomic"  # UPDATE ... SET x = x - 1 WHERE x >= 1 (conditional in-place update)
    UPSERT = "upsert"  # INSERT ... ON CONFLICT (idempotency guard)


class CdcOp(StrEnum):
    """Debezium ``op`` values."""

    CREATE = "c"
    UPDATE = "u"
    DELETE = "d"
    READ = "r"  # snapshot
    TRUNCATE = "t"


@dataclass(frozen=True, slots=True)
class Resource:
    """The OTel resource a span or log came from (semantic-convention attributes only).

    ``version`` identifies the *build* everything downstream keys by (detectors, the proof judge, issues): the
    ``service.version`` attribute, or, for a team that does not bump it, the deploy's commit (``revision``:
    ``vcs.ref.head.revision``) or else its image digest (``digest``), as :func:`build_identity` chooses at decode
    time. ``identified_by`` says which (``""``: none of them; the proof judge then uses deploy marks).
    """

    service: str
    version: str = ""
    environment: str = ""
    revision: str = ""
    digest: str = ""  # oci.manifest.digest, else container.image.repo_digests[0]'s digest, else container.image.id

    @property
    def identified_by(self) -> str:
        """How ``version`` identifies the build: "version", "commit", "digest" or "" (not at all)."""
        if not self.version:
            return ""
        if self.version == self.revision:
            return "commit"
        return "digest" if self.version == self.digest else "version"


def build_identity(version: str, revision: str, digest: str) -> str:
    """The build a resource belongs to: ``service.version``, else the commit, else the image digest ("" none)."""
    return version or revision or digest


@dataclass(frozen=True, slots=True)
class DbCall:
    """The database part of a DB client span, before SQL analysis."""

    system: str  # db.system.name / db.system
    statement: str  # db.query.text / db.statement
    namespace: str = ""  # db.namespace / db.name
    collection: str = ""  # db.collection.name / db.sql.table
    operation: str = ""  # db.operation.name / db.operation
    # Positional parameters (db.statement.parameters tuple repr, or db.query.parameter.<n>) ...
    params: tuple[Scalar, ...] = ()
    # ... and named ones (db.query.parameter.<name>).
    named_params: tuple[tuple[str, Scalar], ...] = ()
    tx_id: str = ""  # transaction id recorded by the app (configured attribute), matches Debezium txId
    row_version: str = ""  # row version the app recorded as read (configured attribute)


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One decoded OTLP log record."""

    time_ns: int
    resource: Resource
    severity_number: int
    severity_text: str
    body: str
    event_name: str = ""  # event.name attribute or LogRecord.event_name
    trace_id: str = ""
    span_id: str = ""
    exception_type: str = ""


@dataclass(frozen=True, slots=True)
class RowChange:
    """One committed row change from a Debezium envelope."""

    table: str  # "<schema>.<table>" as Debezium's source block names it
    op: CdcOp
    key: tuple[tuple[str, Scalar], ...]  # primary key columns and values, in key order
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    commit_ts_ms: int  # source.ts_ms: when the database committed
    ts_ms: int  # envelope ts_ms: when Debezium processed it
    lsn: int
    tx_id: str  # source.txId, as a string ("" when absent)
    topic: str = ""
    partition: int = 0
    offset: int = 0

    @property
    def entity_key(self) -> str:
        """``<table>:<key values joined by '|'>``, the table without its schema."""
        return entity_key(self.table, tuple(v for _, v in self.key))


@dataclass(frozen=True, slots=True)
class Access:
    """A read or a write of one row by one DB client span: the unit the collision detector works on."""

    entity: str  # entity key, e.g. "orders:8812"
    table: str  # table name without schema
    operation: DbOperation
    lock: LockMode
    trace_id: str
    span_id: str
    service: str
    version: str
    start_ns: int
    end_ns: int
    statement: str
    params: tuple[Scalar, ...] = ()
    # Column → value the statement sets (UPDATE ... SET / INSERT VALUES), where they are literal or parameters.
    set_values: tuple[tuple[str, Scalar], ...] = ()
    # Column predicates in the WHERE clause other than the key (e.g. version = 3, stock >= 1); of a predicate
    # access, every term of the WHERE (IN's value is a tuple of values).
    predicates: tuple[tuple[str, str, Scalar | tuple[Scalar, ...]], ...] = ()
    read_version: str = ""
    tx_id: str = ""
    error: bool = False
    function: str = ""  # code.function.name of the nearest ancestor that has one (else: located, see below)
    file: str = ""
    # Where the code is when no span names it (processors.codeloc): the line, how it was located (code_attributes
    # | stacktrace | route | statement) and, when ambiguous, the candidate functions (function and file then "").
    line: int = 0
    located_by: str = ""
    candidates: tuple[str, ...] = ()
    idempotency_key: str = ""
    links: tuple[str, ...] = field(default=())
    # Columns of set_values whose value is SQL expression text (e.g. "stock - 1"), not a bound value.
    set_exprs: tuple[str, ...] = ()
    # The request (root span) the access belongs to, filled in by stage 1 when the trace closes.
    route: str = ""  # http.route or name of the root span
    request_start_ns: int = 0
    request_end_ns: int = 0
    trace_error: bool = False  # some span of the trace failed
    trace_exception: str = ""  # the first exception type recorded in the trace
    trace_status: int = 0  # http.response.status_code of the root span
    # A predicate access: the statement names no row by its key (a range, a non-key column, an INSERT whose key
    # the database assigns); ``entity`` is then the table's scope key (``table:*``) and ``predicates`` the WHERE.
    keyed: bool = True
    exact: bool = True  # the WHERE is wholly known: ``predicates`` are all of it, or ``where`` has no unknown part
    where: Predicate | None = None  # of a predicate access, its whole WHERE with the span's parameters
    # How ``entity`` was found (``Keying``): the span's parameters (``bound``), the row change the statement made
    # (``by_change``), what a later statement of the same trace proved (``by_trace``), or not at all (``predicate``:
    # the table's scope). An inferred key names ``key_candidates`` rows it may be (1: that row) with a confidence.
    keying: str = "bound"
    key_candidates: int = 1
    key_confidence: float = 1.0
    # The statement's shape, parameters or not: the columns its WHERE compares and the columns it sets; the WHERE
    # terms (column, operator) whose values the span does not carry (only of a WHERE read whole: ``exact`` then
    # holds once they are bound); and whether it names one row by its key through such placeholders.
    filters: tuple[str, ...] = ()
    set_columns: tuple[str, ...] = ()
    unbound: tuple[tuple[str, str], ...] = ()
    unbound_key: bool = False
    # The probability its trace was kept with (``processors.model.sampling``; None: unknown, not the same as 1).
    trace_sampling: float | None = None


class Keying(StrEnum):
    """How an access's row was found (``Access.keying``)."""

    BOUND = "bound"  # the key's values are the span's parameters (or literals)
    BY_CHANGE = "by_change"  # a write without them: the row of the committed change credited to it
    BY_TRACE = "by_trace"  # a read without them: the row a later write of the same trace on the table got
    PREDICATE = "predicate"  # no row known: an access of the table's scope, its WHERE evaluated on row images


ACCESS_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Access))
new_access = maker(Access)  # Access(...) at a seventh of the cost (processors.model.fast)
access_values = operator.attrgetter(*ACCESS_FIELDS)  # an Access's values in ACCESS_FIELDS order, in one C call


@dataclass(frozen=True, slots=True)
class Commit:
    """A committed row change, with the trace and span that made it when correlation found them."""

    change: RowChange
    trace_id: str = ""
    span_id: str = ""
    strength: str = "none"  # trace_column | tx_id | values_time | commit_order | tied | none
    skew_ms: float | None = None


@dataclass(frozen=True, slots=True)
class Relay:
    """A stage-1 processor's message to the stage-2 processor of the same component, on the internal topic.

    Some work needs every stage-1 instance's share of one window (the regression tests on a window's statistics):
    stage 1 relays each share, keyed by ``key`` so that all of them reach one stage-2 instance, ahead of the
    watermark that promises them. ``at_ns`` is the event time it is about (a window's end): stage 2 refuses one from
    beyond the wall clock, like any internal event. ``body`` is JSON data; the receiving processor validates it (a
    body that does not validate raises ``ValueError``, and its record is dead-lettered).
    """

    component: str  # the receiving processor's name
    key: str  # the routing key: one key, one internal partition, one stage-2 instance
    at_ns: int
    body: dict[str, Any]


def change_followed(write_end_ns: int, changed_ns: int, skew_ns: int) -> bool:
    """Whether a row change committed at ``changed_ns`` (ms precision) came no earlier than a write that ended at
    ``write_end_ns``, within the clock skew: it is that write's own change or a later one (Debezium sends a row's
    changes in commit order), so no change of that write is still to come. Stage 2 holds a written row, and the
    write, for a late change until this holds (``windows.max_cdc_lag_s``)."""
    return write_end_ns <= changed_ns + skew_ns + MS_NS


def scope_key(table: str) -> str:
    """The entity key of a table's predicate accesses, e.g. ``orders:*``."""
    return table.rsplit(".", 1)[-1] + ":*"


def entity_key(table: str, key_values: tuple[Scalar, ...]) -> str:
    """The graph's Entity key: table name (no schema) and key values, e.g. ``orders:8812``."""
    bare = table.rsplit(".", 1)[-1]
    return bare + ":" + "|".join("" if v is None else str(v) for v in key_values)
