"""Hypothesis strategies for *valid* messages with *hostile content*, as the daemon reads them off Kafka.

A byte-level fuzz (``tests/runtime/test_fuzz.py``) almost never produces a message that decodes; these build
messages that are valid in form — OTLP ``TracesData`` protobuf, the collector's OTLP/JSON (hex ids, camelCase,
int64 as decimal strings), Debezium JSON envelopes with and without the ``schema``/``payload`` wrapper, c/u/d/r and
tombstones — whose content is what production can send: huge integers, ``NaN``/``Infinity``, NUL and control
characters, lone surrogates (JSON only: protobuf strings are UTF-8), deep nesting, strings past the attribute bound
(up to a megabyte, bounded so runs stay fast), SQL from a small grammar of placeholders (``%s``, ``%(name)s``, ``$1``,
``:name``, ``?`` and their odd cousins ``$\u0661``, ``$²``, ``$`` + thousands of digits), quoting, comments and dollar
quotes, timestamps at 0, 2**63-1, far future and far past, negative durations and duplicate ids.

Each generated message knows what the stages must do with it: ``OtlpMessage.good`` are ordinary requests (a server
span, a handler, one ``UPDATE orders`` span) whose row accesses must come out of stage 1 whatever else the message
holds; ``valid`` says whether the message as a whole must be accepted (else it is dead-lettered with a reason);
``Change.valid`` the same for a Debezium record.
"""

from __future__ import annotations

import base64
import functools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

S = 1_000_000_000
MS = 1_000_000
NOW = 1_800_000_000 * S  # the fake wall clock when a run starts (``tests.runtime.chain.T0``)
FUTURE_SKEW = 300 * S  # windows.max_future_skew_s
LONGEST = 24 * 3600 * S  # windows.max_span_duration_s
ATTRIBUTE_BYTES = 65_536  # decode.max_attribute_bytes
PROTO_MAX_NESTING = 30  # arrays and kvlists inside each other in one attribute (upb parses 100 message levels)

HUGE_DIGITS = "9" * 5_000  # past Python's int-string limit (4300 digits)

# ---- scalar content --------------------------------------------------------------------------------------------
# Content is mostly drawn from fixed pools (one draw each: the long run needs 10⁵ examples), with a little generated
# text and a recursive branch for variety.

NUMERIC_TEXTS = [
    "NaN",
    "nan",
    "Infinity",
    "-Infinity",
    "inf",
    "sNaN",
    "-sNaN",
    "-0",
    "1e400",
    "-1e400",
    "1e999999999",
    "1e-999999999",
    "1E+2147483648",
    HUGE_DIGITS,
    "-" + HUGE_DIGITS,
    "9" * 400,
    "0.1",
    "12.50",
    " 7 ",
    "1_000",
    "\u0661\u0662",
    "0x1F",
    "1e",
    "--1",
]
ODD_TEXTS = [
    "",
    " ",
    "paid",
    "\x00",
    "a\x00b",
    "\x00" * 9,
    "\t\r\n",
    "\x7f\x1b[31m",
    "\u2028\u2029",
    "\ufeff",
    "é",
    "😀",
    "\U0001d7cf",
    "'",
    "''",
    '"',
    "\\",
    "\\u0000",
    "%s",
    "%(x)s",
    "$1",
    ":name",
    "?",
    "NULL",
    "None",
    "{}",
    "[]",
    "()",
    "' OR 1=1 --",
    "`",
    "$$",
    "{{x}}",
    "</script>",
    "\u0301",
]
LONE_SURROGATES = ["\ud800", "x\udfff", "\udbff\udbff", "a\ud83d"]  # valid JSON escapes, not Unicode
# Past the attribute bound (64 KiB): by one byte, in 2- and 4-byte characters, NULs; and one of a megabyte.
BIG_TEXTS = ["x" * (ATTRIBUTE_BYTES + 1), "é" * 35_000, "😀" * 17_000, "\x00" * 70_000, "9" * 70_000, "x" * 1_048_576]


def constants(items: Sequence[Any]) -> st.SearchStrategy[Any]:
    """``st.sampled_from(items)`` whose repr does not hold the items: hypothesis puts a strategy's repr in messages
    it keeps per example (a recursive draw past its leaves), and these items are megabyte strings."""
    return st.integers(0, len(items) - 1).map(lambda i: items[i])


def _pick(common: st.SearchStrategy[Any], rare: st.SearchStrategy[Any], odds: int) -> st.SearchStrategy[Any]:
    """``rare`` once in ``odds`` draws, else ``common``."""
    return st.integers(0, odds - 1).flatmap(lambda r: rare if r == 0 else common)


@functools.cache
def texts(*, surrogates: bool = False, big: bool = True) -> st.SearchStrategy[str]:
    """Hostile text: odd characters, numbers that are not, now and then a string past the attribute bound; lone
    surrogates when the wire can carry them (JSON)."""
    pool = ODD_TEXTS + NUMERIC_TEXTS + (LONE_SURROGATES if surrogates else [])
    normal = _pick(constants(pool), st.text(max_size=12), 4)
    return _pick(normal, constants(BIG_TEXTS), 40) if big else normal


INT64_EDGES = [0, 1, -1, 8812, 2**31, 2**53 + 1, 2**63 - 1, -(2**63)]
DOUBLE_EDGES = [math.nan, math.inf, -math.inf, -0.0, 1e308, 5e-324, 0.1, 2.0**63]
INT64 = _pick(st.sampled_from(INT64_EDGES), st.integers(-(2**63), 2**63 - 1), 3)
DOUBLES = _pick(st.sampled_from(DOUBLE_EDGES), st.floats(), 3)

# ---- OTLP AnyValue ---------------------------------------------------------------------------------------------

Value = tuple[
    str, Any
]  # ("s", str) ("i", int) ("d", float) ("b", bool) ("y", bytes) ("a", [Value]) ("k", [(k, V)]) ("n", None)


def _nested(depth: int, leaf: Value) -> Value:
    for i in range(depth):
        leaf = ("a", [leaf]) if i % 2 else ("k", [("k", leaf)])
    return leaf


def _value_pool(surrogates: bool, max_nesting: int) -> list[Value]:
    texts_ = ODD_TEXTS + NUMERIC_TEXTS + (LONE_SURROGATES if surrogates else [])
    pool: list[Value] = [("s", t) for t in texts_]
    pool += [("i", i) for i in INT64_EDGES] + [("d", d) for d in DOUBLE_EDGES] + [("b", True), ("b", False)]
    pool += [("y", b""), ("y", b"\x00\xff"), ("y", b"\x00" * 40_000), ("n", None), ("a", []), ("k", [])]
    pool += [
        ("a", [("s", "NaN"), ("i", 2**63 - 1), ("d", math.nan), ("n", None)]),
        ("k", [("", ("s", "\x00")), ("k", ("a", [("y", b"\x01")])), ("k", ("i", -1))]),
        ("a", [("s", HUGE_DIGITS)] * 3),
        ("k", [(t, ("s", t)) for t in ODD_TEXTS[:8]]),
    ]
    pool += [_nested(depth, ("s", "deep")) for depth in sorted({2, 20, 31, max_nesting})]
    return pool


@functools.cache
def values(*, surrogates: bool = False, max_nesting: int = PROTO_MAX_NESTING) -> st.SearchStrategy[Value]:
    """An attribute value of any OTLP type with hostile content: nested arrays and kvlists, numbers at their edges,
    strings past the bound."""
    pooled = constants(_value_pool(surrogates, max_nesting))
    scalars = st.one_of(
        texts(surrogates=surrogates, big=False).map(lambda s: ("s", s)),
        INT64.map(lambda i: ("i", i)),
        DOUBLES.map(lambda d: ("d", d)),
        st.binary(max_size=8).map(lambda b: ("y", b)),
    )
    nested = st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=3).map(lambda xs: ("a", xs))
            | st.lists(st.tuples(texts(surrogates=surrogates, big=False), inner), max_size=3).map(lambda kv: ("k", kv))
        ),
        max_leaves=4,
    )
    return _pick(_pick(pooled, scalars, 3), nested, 8)


def any_value(v: Value) -> AnyValue:
    kind, x = v
    av = AnyValue()
    if kind == "s":
        av.string_value = x
    elif kind == "i":
        av.int_value = x
    elif kind == "d":
        av.double_value = x
    elif kind == "b":
        av.bool_value = x
    elif kind == "y":
        av.bytes_value = x
    elif kind == "a":
        av.array_value.values.extend([any_value(e) for e in x])
    elif kind == "k":
        av.kvlist_value.values.extend([KeyValue(key=k, value=any_value(e)) for k, e in x])
    return av


def json_value(v: Value) -> dict[str, Any]:
    """An AnyValue as the collector writes it in OTLP/JSON (int64 as a decimal string, bytes as base64)."""
    kind, x = v
    if kind == "s":
        return {"stringValue": x}
    if kind == "i":
        return {"intValue": str(x)}
    if kind == "d":
        return {"doubleValue": x if math.isfinite(x) else "NaN" if x != x else "Infinity" if x > 0 else "-Infinity"}
    if kind == "b":
        return {"boolValue": x}
    if kind == "y":
        return {"bytesValue": base64.b64encode(x).decode()}
    if kind == "a":
        return {"arrayValue": {"values": [json_value(e) for e in x]}}
    if kind == "k":
        return {"kvlistValue": {"values": [{"key": k, "value": json_value(e)} for k, e in x]}}
    return {}


# ---- SQL from a small grammar --------------------------------------------------------------------------------

PLACEHOLDERS = [
    "%s",
    "%(name)s",
    "%(id)s",
    "$1",
    "$2",
    "$3",
    ":name",
    ":id",
    "?",
    "?::int",
    "$1::bigint",
    "$\u0661",
    "$²",
    "$0",
    "$-1",
    "$" + "1" * 40,
    "$" + "7" * 5_000,
    "%(\u0661)s",
    ":\u0661",
    "@p1",
    "%%s",
    "$1a",
]
LITERALS = [
    "1",
    "8812",
    "-5",
    "0",
    "1e400",
    "-1e400",
    "9" * 400,
    "9" * 5_000,
    "-" + "9" * 5_000,
    "0.1",
    "1.000000000000000000000001",
    "1_000",
    "'paid'",
    "'it''s'",
    "E'a\\'b'",
    "$$dollar 'quoted'$$",
    "$tag$x $1 ?$tag$",
    "NULL",
    "TRUE",
    "FALSE",
    "'\x00'",
    "'NaN'",
    "'Infinity'",
    "x'1F'",
    "0x1F",
    "B'101'",
    "'2024-01-01'::date",
    "ARRAY[1, 2]",
    "(SELECT 1)",
    "now()",
    "-(3)",
]
EXPRESSIONS = [
    "{0} % {1} = {2}", "{0} / {1} > {2}", "-{0} * 2 + {1} <> {2}", "lower({0}) LIKE {1}", "upper({0}) NOT ILIKE {1}",
    "{0} LIKE {1} ESCAPE {2}", "{0} BETWEEN {1} AND {2}", "{0} NOT BETWEEN {1} AND {2}", "{0} IS DISTINCT FROM {1}",
    "{0} IS NOT DISTINCT FROM {1}", "{0} NOT IN ({1}, {2})", "{0} = ANY(ARRAY[{1}, {2}])", "{0} = ANY({1})",
    "coalesce({0}, {1}) = {2}", "nullif({0}, {1}) IS NULL", "abs({0}) >= {1}", "length({0}) < {1}",
    "date_trunc('day', {0}) = {1}", "CAST({0} AS INTEGER) = {1}", "{1}::NUMERIC < {0}", "md5({0}) = {1}",
    "({0} = {1} OR NOT ({0} < {2})) IS NOT TRUE", "{0} IN (SELECT {1})", "EXISTS (SELECT {1})",
]  # fmt: skip
COMMENTS = ["", " ", " -- c\n", " /* c */ ", " /* /* nested */ */ ", " --\n", "\n", " /* $1 ? %s */ "]
TABLES = ["orders", "public.orders", "inventory", '"Orders"', '"we""ird"', "t" * 70, "shop.public.orders"]
COLUMNS = ["id", "status", "stock", "version", "amount", '"Id"', "sku", "x" * 64]
_SQL_VALUES = constants(PLACEHOLDERS + LITERALS)
_COLUMNS = constants(COLUMNS)


@st.composite
def statements(draw: st.DrawFn) -> str:
    """A statement of the grammar: SELECT (FOR UPDATE/SHARE), UPDATE (set, relative, guarded), INSERT (ON
    CONFLICT, RETURNING), DELETE, a CTE, two statements, or plain garbage, with comments between the parts."""
    value = _SQL_VALUES
    c = lambda: draw(st.sampled_from(COMMENTS))  # noqa: E731
    col = lambda: draw(_COLUMNS)  # noqa: E731

    def condition() -> str:
        op = draw(st.sampled_from(["=", ">=", "<", "<>", "IS", "IS NOT", "IN", "flag", "OR", "expr"]))
        if op == "expr":  # what only the evaluator reads: arithmetic, functions, LIKE, BETWEEN, DISTINCT, ANY
            return draw(st.sampled_from(EXPRESSIONS)).format(col(), draw(value), draw(value))
        if op in ("IS", "IS NOT"):
            return f"{col()} {op} {draw(st.sampled_from(['NULL', 'TRUE', 'FALSE']))}"
        if op == "IN":
            return f"{col()} IN ({', '.join(draw(st.lists(value, min_size=1, max_size=3)))})"
        if op == "flag":
            return draw(st.sampled_from(["on_call", "NOT on_call"]))
        if op == "OR":
            return f"({col()} = {draw(value)} OR {col()} = {draw(value)})"
        return f"{col()} {op} {draw(value)}" if draw(st.booleans()) else f"{draw(value)} {op} {col()}"

    where = f"WHERE{c()}" + f" AND{c()}".join(condition() for _ in range(draw(st.integers(1, 3))))
    table = draw(constants(TABLES))
    kind = draw(st.sampled_from(["select", "update", "insert", "delete", "cte", "two", "garbage"]))
    if kind == "select":
        lock = draw(st.sampled_from(["", " FOR UPDATE", " FOR SHARE", " FOR NO KEY UPDATE", " LIMIT 1"]))
        sql = f"SELECT{c()}{col()}, {col()} FROM {table}{c()}{where}{lock}"
    elif kind == "update":
        column = col()
        sets = draw(
            st.sampled_from(
                [
                    f"{column} = {draw(value)}",
                    f"{column} = {column} - {draw(value)}",
                    f"{column} = {draw(value)} + {column}",
                    f"{column} = DEFAULT",
                ]
            )
        )
        sql = f"UPDATE {table} SET{c()}{sets}{c()}{where}"
    elif kind == "insert":
        n = draw(st.integers(1, 3))
        rows = ", ".join("(" + ", ".join(draw(value) for _ in range(n)) + ")" for _ in range(draw(st.integers(1, 2))))
        tail = draw(st.sampled_from(["", " RETURNING id", " ON CONFLICT (id) DO NOTHING", " ON CONFLICT DO NOTHING"]))
        sql = f"INSERT INTO {table} ({', '.join(col() for _ in range(n))}) VALUES{c()}{rows}{tail}"
    elif kind == "delete":
        sql = f"DELETE FROM {table}{c()}{where}"
    elif kind == "cte":
        sql = f"WITH x AS (SELECT {col()} FROM {table} {where}) SELECT * FROM x"
    elif kind == "two":
        sql = f"SELECT 1; UPDATE {table} SET {col()} = {draw(value)} {where}"
    else:
        sql = draw(st.text(max_size=40))
    return c() + sql + c()


STATEMENTS = statements()


# ---- statement parameters ----------------------------------------------------------------------------------------

PARAM_ITEMS = [
    "'paid'",
    "8812",
    "-1",
    "0",
    "None",
    "True",
    "2.5",
    "1e400",
    "float('nan')",
    "nan",
    "inf",
    HUGE_DIGITS,
    "-" + HUGE_DIGITS,
    "9" * 400,
    "Decimal('NaN')",
    "Decimal('12.50')",
    "Decimal('-Infinity')",
    "Decimal('1E+400')",
    "datetime.datetime(2024, 1, 1, 0, 0)",
    "UUID('12345678-1234-5678-1234-567812345678')",
    "b'\\x00'",
    "'\\x00'",
    "'a\\'b'",
    "'\\e'",
    "(1, 2)",
    "[1, [2, [3]]]",
    "{'a': 1}",
    "{1, 2}",
    "...",
    "__import__('os').getcwd()",
    "'" + "x" * 70_000 + "'",
]


@st.composite
def parameter_texts(draw: st.DrawFn) -> str:
    """``db.statement.parameters`` as a driver's repr: a tuple, a list, a dict, one value or something broken."""
    items = draw(st.lists(constants(PARAM_ITEMS), max_size=4))
    shape = draw(st.sampled_from(["tuple", "list", "dict", "one", "broken"]))
    if shape == "tuple":
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if shape == "list":
        return "[" + ", ".join(items) + "]"
    if shape == "dict":
        return "{" + ", ".join(f"'k{i}': {v}" for i, v in enumerate(items)) + "}"
    if shape == "one":
        return items[0] if items else ""
    return "(" + ", ".join(items) + draw(st.sampled_from(["", ",,", "'", "((", "\x00"]))


PARAMETER_TEXTS = parameter_texts()


# ---- spans, traces, OTLP messages --------------------------------------------------------------------------------


@dataclass
class SpanSpec:
    trace_id: bytes
    span_id: bytes
    parent_id: bytes
    name: str
    kind: int
    start: int
    end: int
    status: int = 0
    attributes: list[tuple[str, Value]] = field(default_factory=list)
    events: list[tuple[str, list[tuple[str, Value]]]] = field(default_factory=list)
    links: list[bytes] = field(default_factory=list)

    def sane(self, now_ns: int) -> bool:
        """Whether stage 1's clock sanity keeps it (else it is dropped, counted and its message dead-lettered)."""
        return self.end <= now_ns + FUTURE_SKEW and 0 <= self.end - self.start <= LONGEST


@dataclass
class TraceSpec:
    trace_id: bytes
    spans: list[SpanSpec]
    row: int | None = None  # a good trace: the orders row its UPDATE writes

    @property
    def hex(self) -> str:
        return self.trace_id.hex()


@dataclass
class OtlpMessage:
    resources: list[tuple[list[tuple[str, Value]], list[list[SpanSpec]]]]  # (resource attributes, scopes' spans)
    traces: list[TraceSpec]
    encoding: str  # otlp_proto | otlp_json
    surrogates: bool = False  # holds a lone surrogate (JSON only): then it is refused at decode, whole
    # Protobuf only: one more span, of a trace of its own (``DEEP_TRACE``), with an attribute this deeply nested
    # (0: none). upb refuses such a message whole; its spans are read one by one, and a span nested past upb's
    # limit even on its own (``DEEP_LOST``) is left out and counted.
    deep: int = 0

    @property
    def good(self) -> list[TraceSpec]:
        return [t for t in self.traces if t.row is not None]

    def valid(self, now_ns: int) -> bool:
        """Whether the message is accepted whole: no lone surrogate, every span's times believable."""
        return not self.surrogates and all(s.sane(now_ns) for t in self.traces for s in t.spans)

    def encode(self) -> bytes:
        return to_json(self) if self.encoding == "otlp_json" else to_proto(self)

    def oversize(self, kept: Callable[[str], bool]) -> bool:
        """Whether the decoder must cut something: a span name; a string or bytes (as hex) value of a span attribute
        it reads (``kept(key)``; ``db.query.parameter.*`` only on a DB span); the value a resource or the first
        exception event ends with for a key it reads (the last one given). Nested values can be over the bound
        too, as JSON text: not looked at (so this may say False when something is cut)."""
        for attributes, scopes in self.resources:
            last = dict(attributes)
            env = "deployment.environment.name" if "deployment.environment.name" in last else "deployment.environment"
            if any(
                _big(last[k]) for k in ("service.name", "service.version", env, "vcs.ref.head.revision") if k in last
            ):
                return True
            for s in (s for spans in scopes for s in spans):
                if _big(("s", s.name)):
                    return True
                values = dict(s.attributes)
                db = any(_truthy(values[k]) for k in _DB_KEYS if k in values)
                if any(_big(v) for k, v in s.attributes if kept(k) and (db or not k.startswith("db.query.parameter."))):
                    return True
                exception = next((a for name, a in s.events if name == "exception"), [])  # the first one is read
                if any(_big(v) for v in dict(exception).values()):
                    return True
        return False


_DB_KEYS = ("db.system.name", "db.system", "db.query.text", "db.statement")  # what makes a span a DB span


def _big(value: Value) -> bool:
    if value[0] == "y":
        return 2 * len(value[1]) > ATTRIBUTE_BYTES
    return value[0] == "s" and len(value[1].encode("utf-8", "surrogatepass")) > ATTRIBUTE_BYTES


def _truthy(value: Value) -> bool:
    """Whether the decoder's plain value of ``value`` is true (bytes are hex text; arrays and kvlists containers)."""
    kind, x = value
    return bool(x) if kind != "n" else False


UPDATE = "UPDATE orders SET status = %s WHERE id = %s"


def good_trace(trace_id: bytes, ids: Callable[[], bytes], row: int, start: int) -> TraceSpec:
    """An ordinary request: its server span, its handler, one ``UPDATE orders`` of ``row`` (psycopg's attributes)."""
    root, handler, db = ids(), ids(), ids()
    spans = [
        SpanSpec(
            trace_id,
            root,
            b"",
            "POST /orders/{id}",
            2,
            start,
            start + 6 * MS,
            0,
            [("http.route", ("s", "/orders/{id}")), ("http.response.status_code", ("i", 200))],
        ),
        SpanSpec(
            trace_id,
            handler,
            root,
            "shop.pay",
            1,
            start + MS,
            start + 5 * MS,
            0,
            [("code.function.name", ("s", "shop.pay")), ("code.file.path", ("s", "shop/pay.py"))],
        ),
        SpanSpec(
            trace_id,
            db,
            handler,
            "UPDATE orders",
            3,
            start + 2 * MS,
            start + 3 * MS,
            0,
            [
                ("db.system.name", ("s", "postgresql")),
                ("db.query.text", ("s", UPDATE)),
                ("db.statement.parameters", ("s", f"('paid', {row})")),
            ],
        ),
    ]
    return TraceSpec(trace_id, spans, row)


KEPT_KEYS = [
    "http.route",
    "http.response.status_code",
    "http.status_code",
    "code.function.name",
    "code.function",
    "code.namespace",
    "code.file.path",
    "code.filepath",
    "code.line.number",
    "code.lineno",
    "db.system",
    "db.statement",
    "db.namespace",
    "db.name",
    "db.collection.name",
    "db.sql.table",
    "db.operation.name",
    "db.transaction.id",
    "db.row.version",
    "app.idempotency_key",
    "db.query.parameter.0",
    "db.query.parameter.1",
    "db.query.parameter.name",
    "db.query.parameter.id",
    "db.query.parameter.\u0661",
    "db.query.parameter.99999999999",
    "db.query.parameter.",
    "url.path",
    "",
    "\x00",
]
RESOURCE_KEYS = [
    "service.name",
    "service.version",
    "deployment.environment.name",
    "deployment.environment",
    "vcs.ref.head.revision",
    "host.name",
]


@functools.cache
def times(now_ns: int) -> st.SearchStrategy[tuple[int, int]]:
    """(start, end) of a hostile span: ordinary, or at 0, 2**63-1, 2**64-1, far future, far past, negative or absurd
    durations."""
    edge = st.sampled_from(
        [
            0,
            1,
            2**63 - 1,
            2**64 - 1,
            now_ns + 10 * 365 * 24 * 3600 * S,
            1_000 * S,
            now_ns - 30 * 365 * 24 * 3600 * S,
            now_ns + FUTURE_SKEW - 1,
            now_ns + FUTURE_SKEW + S,
        ]
    )
    ordinary = st.tuples(st.integers(now_ns - 5 * S, now_ns), st.integers(0, 50 * MS)).map(lambda p: (p[0], sum(p)))
    odd = st.tuples(_pick(edge, st.integers(now_ns - 5 * S, now_ns), 2), _pick(edge, st.integers(0, 2**64 - 1), 2))
    return _pick(ordinary, odd, 5)


_KEPT = st.sampled_from(KEPT_KEYS)
_QUERY_KEYS = constants(["0", "1", "2", "name", "id", "\u0661", "99999999999", "", "x" * 40])
_EXCEPTION_KEYS = st.sampled_from(["exception.type", "exception.message"])
_EVENT_NAMES = st.lists(st.sampled_from(["exception", "log", ""]), max_size=2)
_KINDS = st.sampled_from([0, 1, 2, 3, 4, 5, 6, 99])
_STATUSES = st.sampled_from([0, 1, 2, 7])
_PARAMS = st.sampled_from(["text", "array", "query", "none"])


@st.composite
def hostile_trace(
    draw: st.DrawFn, trace_id: bytes, ids: Callable[[], bytes], *, surrogates: bool, now_ns: int, max_nesting: int
) -> TraceSpec:
    """A trace of 1-4 spans with hostile attributes, events, links, ids (duplicates, a span its own parent, parents
    that never come) and times; most have a DB span whose statement comes from the grammar and whose parameters are
    hostile."""
    text = texts(surrogates=surrogates)
    value = values(surrogates=surrogates, max_nesting=max_nesting)
    attribute = st.tuples(_KEPT, value)
    span_ids: list[bytes] = []
    spans: list[SpanSpec] = []
    for i in range(draw(st.integers(1, 4))):
        span_id = span_ids[-1] if span_ids and draw(st.integers(0, 9)) == 0 else ids()  # a duplicate id
        parents = [b"", *span_ids[-2:], span_id, ids(), b"\x00" * 8]
        parent = parents[draw(st.integers(0, len(parents) - 1))] if i else b""
        span_ids.append(span_id)
        start, end = draw(times(now_ns))
        attributes = draw(st.lists(attribute, max_size=4))
        if draw(st.integers(0, 3)):  # a DB client span
            attributes += [("db.system.name", ("s", "postgresql")), ("db.query.text", ("s", draw(STATEMENTS)))]
            params = draw(_PARAMS)
            if params == "text":
                attributes.append(("db.statement.parameters", ("s", draw(PARAMETER_TEXTS))))
            elif params == "array":
                attributes.append(("db.statement.parameters", ("a", draw(st.lists(value, max_size=3)))))
            elif params == "query":
                pairs = draw(st.lists(st.tuples(_QUERY_KEYS, value), max_size=3))
                attributes += [("db.query.parameter." + k, v) for k, v in pairs]
        events = [(name, draw(st.lists(st.tuples(_EXCEPTION_KEYS, value), max_size=2))) for name in draw(_EVENT_NAMES)]
        links = [trace_id, b"\x00" * 16, b"\xff" * 16][: draw(st.integers(0, 3))]
        spans.append(
            SpanSpec(
                trace_id,
                span_id,
                parent,
                draw(text),
                draw(_KINDS),
                start,
                end,
                draw(_STATUSES),
                attributes,
                events,
                links,
            )
        )
    return TraceSpec(trace_id, spans)


@st.composite
def otlp_messages(draw: st.DrawFn, encoding: str, now_ns: int = NOW, ids_from: int = 0) -> OtlpMessage:
    """One OTLP traces message: 0-2 good traces and 0-3 hostile ones (at least one trace), their spans dealt over
    1-2 resources (hostile resource attributes too) and their scopes in any order; JSON may hold lone surrogates
    and nesting protobuf cannot carry."""
    json_ = encoding == "otlp_json"
    surrogates = json_ and draw(st.integers(0, 9)) == 0
    counter = iter(range(ids_from + draw(st.integers(1, 2**32)), 2**62))  # ids are unique past ``ids_from``

    def ids(size: int = 8) -> bytes:
        return next(counter).to_bytes(size, "big")

    traces: list[TraceSpec] = []
    for n in range(draw(st.integers(0, 2))):
        row = 1_000 + n + 10 * draw(st.integers(0, 99))
        traces.append(good_trace(ids(16), ids, row, now_ns - draw(st.integers(100 * MS, 3 * S))))
    for _ in range(draw(st.integers(0 if traces else 1, 3))):
        traces.append(
            draw(
                hostile_trace(
                    ids(16), ids, surrogates=surrogates, now_ns=now_ns, max_nesting=200 if json_ else PROTO_MAX_NESTING
                )
            )
        )
    spans = draw(st.permutations([s for t in traces for s in t.spans]))
    n_resources = draw(st.integers(1, 2))
    resource_attribute = st.tuples(st.sampled_from(RESOURCE_KEYS), values(surrogates=surrogates))
    resources: list[tuple[list[tuple[str, Value]], list[list[SpanSpec]]]] = []
    for r in range(n_resources):
        mine = spans[r::n_resources]
        attrs: list[tuple[str, Value]] = [
            ("service.name", ("s", "shop")),
            *draw(st.lists(resource_attribute, max_size=3)),
        ]
        cut = draw(st.integers(0, len(mine)))
        resources.append((attrs, [mine[:cut], mine[cut:]]))
    message = OtlpMessage(resources, traces, encoding)
    message.surrogates = json_ and not _unicode(json.dumps(_json_doc(message), ensure_ascii=False))
    if not json_ and ids_from == 0:  # (one per batch: the deep trace's ids are fixed)
        message.deep = draw(_pick(st.just(0), st.sampled_from([48, DEEP_LOST]), 10))
    return message


@st.composite
def otlp_batches(draw: st.DrawFn, encoding: str, now_ns: int = NOW) -> list[OtlpMessage]:
    """1-3 messages of one encoding, their ids apart (a hostile trace sharing a good one's trace and span ids
    would pass as that trace's redelivery: the assembler keeps the first copy of a span id)."""
    return [draw(otlp_messages(encoding, now_ns, ids_from=n << 40)) for n in range(draw(st.integers(1, 3)))]


DEEP_TRACE = b"\xde" * 16
DEEP_LOST = 300  # nesting at which a span is unreadable on its own too (48 is only past the message's limit)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field, by hand (upb builds nothing it could not parse back)."""
    head = bytearray()
    for n in (number << 3 | 2, len(payload)):
        while n > 0x7F:
            head.append(n & 0x7F | 0x80)
            n >>= 7
        head.append(n)
    return bytes(head) + payload


def _deep_resource(depth: int, now_ns: int) -> bytes:
    """A ``TracesData.resource_spans`` entry: one span of ``DEEP_TRACE`` whose ``http.route`` is ``depth`` arrays."""
    value = _field(1, b"deep")
    for _ in range(depth):
        value = _field(5, _field(1, value))  # AnyValue.array_value.values = [value]
    span = TracesData()
    span.resource_spans.add().scope_spans.add().spans.add(
        trace_id=DEEP_TRACE,
        span_id=b"\xde" * 8,
        name="deep",
        start_time_unix_nano=now_ns - S,
        end_time_unix_nano=now_ns - S,
    )
    raw = span.resource_spans[0].scope_spans[0].spans[0].SerializeToString()
    raw += _field(9, _field(1, b"http.route") + _field(2, value))
    return _field(1, _field(2, _field(2, raw)))


def to_proto(msg: OtlpMessage) -> bytes:
    return _to_proto(msg) + (_deep_resource(msg.deep, NOW) if msg.deep else b"")


def _to_proto(msg: OtlpMessage) -> bytes:
    data = TracesData()
    for attrs, scopes in msg.resources:
        rs = data.resource_spans.add()
        rs.resource.attributes.extend([KeyValue(key=k, value=any_value(v)) for k, v in attrs])
        for spans in scopes:
            ss = rs.scope_spans.add()
            for s in spans:
                sp = ss.spans.add(
                    trace_id=s.trace_id,
                    span_id=s.span_id,
                    parent_span_id=s.parent_id,
                    name=s.name,
                    kind=s.kind,
                    start_time_unix_nano=s.start % 2**64,
                    end_time_unix_nano=s.end % 2**64,
                )
                sp.status.code = s.status
                sp.attributes.extend([KeyValue(key=k, value=any_value(v)) for k, v in s.attributes])
                for name, ev_attrs in s.events:
                    sp.events.add(name=name).attributes.extend(
                        [KeyValue(key=k, value=any_value(v)) for k, v in ev_attrs]
                    )
                for link in s.links:
                    sp.links.add(trace_id=link, span_id=b"\x01" * 8)
    return bytes(data.SerializeToString())


def _json_span(s: SpanSpec) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "traceId": s.trace_id.hex(),
        "spanId": s.span_id.hex(),
        "name": s.name,
        "kind": s.kind,
        "startTimeUnixNano": str(s.start),
        "endTimeUnixNano": str(s.end),
        "attributes": [{"key": k, "value": json_value(v)} for k, v in s.attributes],
        "status": {"code": s.status} if s.status else {},
    }
    if s.parent_id:
        doc["parentSpanId"] = s.parent_id.hex()
    if s.events:
        doc["events"] = [
            {"name": n, "attributes": [{"key": k, "value": json_value(v)} for k, v in a]} for n, a in s.events
        ]
    if s.links:
        doc["links"] = [{"traceId": link.hex(), "spanId": "01" * 8} for link in s.links]
    return doc


def _json_doc(msg: OtlpMessage) -> dict[str, Any]:
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": k, "value": json_value(v)} for k, v in attrs]},
                "scopeSpans": [{"scope": {}, "spans": [_json_span(s) for s in spans]} for spans in scopes],
            }
            for attrs, scopes in msg.resources
        ]
    }


def to_json(msg: OtlpMessage) -> bytes:
    """OTLP/JSON as the collector's ``otlp_json`` encoding writes it: camelCase, lowercase hex ids, int64 as
    decimal strings (lone surrogates escaped, as JSON allows)."""
    return json.dumps(_json_doc(msg)).encode()


def _unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# ---- Debezium ------------------------------------------------------------------------------------------------

_RAW = "\u0000raw:"  # a marker: the JSON text of this string is written raw (a number json.dumps cannot write)


@dataclass
class Change:
    """One Debezium record (topic, key, value) and whether stage 1 must pass it on (``valid``), may refuse it with
    a reason, or must take it as a tombstone."""

    topic: str
    key: bytes | None
    value: bytes | None
    valid: bool
    tombstone: bool = False


def _dumps(doc: Any) -> bytes:
    """JSON with the ``_RAW`` strings written as the raw text they carry (an integer literal of 5000 digits)."""
    text = json.dumps(doc)
    while (start := text.find(json.dumps(_RAW)[:-1])) >= 0:
        end = text.index('"', start + 1)
        raw = json.loads(text[start : end + 1])[len(_RAW) :]
        text = text[:start] + raw + text[end + 1 :]
    return text.encode()


def raw_number(digits: str) -> str:
    return _RAW + digits


ROW_VALUES: list[Any] = [
    "NaN",
    "Infinity",
    "-Infinity",
    "sNaN",
    "1e999999999",
    HUGE_DIGITS,
    "-" + HUGE_DIGITS,
    math.nan,
    math.inf,
    -math.inf,
    -0.0,
    2**63,
    -(2**63) - 1,
    2**64,
    10**300,
    1e308,
    raw_number("9" * 5_000),
    raw_number("-" + "9" * 4_400),
    "\x00",
    "a\x00b",
    "",
    "😀",
    True,
    None,
    [],
    {},
    {"scale": 2, "value": "AQ=="},
    "__debezium_unavailable_value",
    "12.50",
    " 3 ",
    "-1",
    0,
    -1,
    1,
]


def _deep(depth: int) -> Any:
    nested: Any = 1
    for i in range(depth):
        nested = [nested] if i % 2 else {"k": nested}
    return nested


@functools.cache
def row_values(*, surrogates: bool) -> st.SearchStrategy[Any]:
    """A column value: a hostile number (Debezium's string decimals included), text, a struct, deep nesting."""
    pool = ROW_VALUES + BIG_TEXTS + [_deep(10), _deep(100), _deep(400)] + (LONE_SURROGATES if surrogates else [])
    generated = st.one_of(st.integers(-(2**70), 2**70), DOUBLES, texts(big=False))
    return _pick(constants(pool), generated, 3)


def _commit_edges(now_ms: int) -> list[int]:
    # a database clock a second ahead; commits beyond the wall clock + skew (checked before any watermark sees them)
    return [0, 1, -1, now_ms - 30 * 365 * 24 * 3600 * 1000, now_ms + 1_000,
            2**63 - 1, now_ms + 10 * 365 * 24 * 3600 * 1000, now_ms + FUTURE_SKEW // MS + 1]  # fmt: skip


@st.composite
def changes(draw: st.DrawFn, now_ms: int, topic_prefix: str = "shop.public") -> Change:
    """One Debezium record of ``orders`` (key ``id``) or ``inventory`` (key ``sku``): c/u/d/r/t or a tombstone, with
    or without the schema wrapper, hostile column values, commit times at 0, 2**63-1, far future or far past, odd
    lsns and transaction ids."""
    table, key_column = draw(st.sampled_from([("orders", "id"), ("inventory", "sku")]))
    topic = f"{topic_prefix}.{table}"
    surrogates = draw(st.integers(0, 19)) == 0
    valid = True
    key_value = draw(st.one_of(st.integers(1, 50), constants(["sku-1", "", "\x00", 2**64, HUGE_DIGITS])))
    if draw(st.integers(0, 29)) == 0:
        key_value = "k" * 70_000  # a key past the bound: refused
        valid = False
    if draw(st.integers(0, 9)) == 0:
        return Change(topic, _dumps({key_column: key_value}), None, True, tombstone=True)
    op = draw(st.sampled_from(["c", "u", "d", "r"]))
    columns = st.sampled_from(["status", "stock", "amount", "note", "payload", '"quoted"', ""])

    def image() -> dict[str, Any]:
        row = {key_column: key_value}
        row.update(draw(st.dictionaries(columns, row_values(surrogates=surrogates), max_size=4)))
        return row

    before = image() if op in ("u", "d") else None
    after = image() if op in ("c", "u", "r") else None
    commit_ms = draw(_pick(st.integers(now_ms - 3_000, now_ms), st.sampled_from(_commit_edges(now_ms)), 3))
    if commit_ms * MS > now_ms * MS + FUTURE_SKEW:
        valid = False  # dropped by clock sanity, dead-lettered as clock_skew
    source = {
        "version": "3.6.1.Final",
        "connector": "postgresql",
        "name": "shop",
        "ts_ms": commit_ms,
        "db": "shop",
        "schema": "public",
        "table": table,
        "txId": draw(st.one_of(st.integers(0, 2**70), st.just("tx\x00"))),
        "lsn": draw(st.one_of(st.integers(0, 2**64), st.sampled_from([-5, 2**63 - 1]))),
    }
    envelope = {"before": before, "after": after, "source": source, "op": op, "ts_ms": commit_ms + 40}
    if draw(st.booleans()):
        envelope = {"schema": {"type": "struct", "optional": False}, "payload": envelope}
    key = _dumps({key_column: key_value}) if draw(st.integers(0, 4)) else None
    if key is None and key_column != "id":
        valid = False  # no message key and no ``id`` column: refused (debezium_missing_key)
    if surrogates and not _unicode(json.dumps(envelope, ensure_ascii=False)):
        valid = False  # a lone surrogate: refused at decode (invalid_unicode)
    return Change(topic, key, _dumps(envelope), valid)


def debezium_batches(now_ms: int) -> st.SearchStrategy[Sequence[Change]]:
    return st.lists(changes(now_ms), min_size=1, max_size=4)
