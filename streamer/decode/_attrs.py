"""Options, counters and the attribute-extraction core shared by the OTLP protobuf and JSON decoders.

Decoders turn only the attributes whose key is in ``span_keys`` into plain Python values (str, int, float,
bool, None, list, dict) and store them in a list by slot; ``Extractor`` turns those slots into event fields.
Current semantic-convention names fill slot ``i``, older names slot ``i + N`` and lose to the current ones.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from processors.model.events import DbCall, Resource, Scalar, SpanKind, StatusCode, build_identity
from processors.model.fast import maker
from processors.model.sampling import UNKNOWN, Sampling, span_sampling
from streamer.decode.literals import literal_params, plain_scalar, to_text

_new_db_call = maker(DbCall)  # DbCall(...) without its field-by-field frozen stores (processors.model.fast)


@dataclass(frozen=True, slots=True)
class DecodeOptions:
    """Configurable attribute names and size bounds."""

    tx_id_attribute: str = "db.transaction.id"
    row_version_attribute: str = "db.row.version"
    idempotency_key_attribute: str = "app.idempotency_key"
    max_attribute_bytes: int = 65536
    max_message_bytes: int = 64 * 1024 * 1024


@dataclass(slots=True)
class DecodeStats:
    """Counters a caller may pass in to learn what decoding did."""

    spans: int = 0
    log_records: int = 0
    truncated_attributes: int = 0
    unreadable_spans: int = 0  # left out of a message upb could not parse whole (protobuf only)


DEFAULT_OPTIONS = DecodeOptions()
EXCEPTION_EVENT = "exception"
QUERY_PARAM = "db.query.parameter."
MAX_DEPTH = 32  # array/kvlist nesting kept when a value is flattened to text

# Span attribute slots.
ROUTE, HTTP_STATUS, CODE_FUNC, CODE_NS, CODE_FILE, CODE_LINE = range(6)
DB_SYSTEM, DB_TEXT, DB_NS, DB_COLL, DB_OP, DB_PARAMS, TX_ID, ROW_VERSION, IDEM_KEY = range(6, 15)
SAMPLER_TYPE, SAMPLER_PARAM = 15, 16  # Jaeger clients' sampler attributes (processors.model.sampling)
N = 17
SPAN_SLOTS = 2 * N
OWN_SLOTS = frozenset({DB_PARAMS, TX_ID, ROW_VERSION, IDEM_KEY})  # values of one span each (not shared)
# Slots whose value is text even when sent as bytes (psycopg2's ``execute_values`` statement is ``bytes``).
TEXT_SLOTS = frozenset({DB_TEXT, DB_TEXT + N})
# Slots of a few distinct values (routes, code locations, statements with placeholders): their text is interned, since
# open traces hold every span's copy (parameters, ids and keys are not: each is new).
INTERNED_SLOTS = frozenset(s + n for s in (ROUTE, CODE_FUNC, CODE_FILE, DB_SYSTEM, DB_TEXT, DB_NS, DB_COLL, DB_OP)
                           for n in (0, N))  # fmt: skip
_CURRENT_KEYS = {
    "http.route": ROUTE,
    "http.response.status_code": HTTP_STATUS,
    "code.function.name": CODE_FUNC,
    "code.file.path": CODE_FILE,
    "code.line.number": CODE_LINE,
    "db.system.name": DB_SYSTEM,
    "db.query.text": DB_TEXT,
    "db.namespace": DB_NS,
    "db.collection.name": DB_COLL,
    "db.operation.name": DB_OP,
    "db.statement.parameters": DB_PARAMS,
    "code.namespace": CODE_NS,  # older only: joined with the older code.function
    "sampler.type": SAMPLER_TYPE,
    "sampler.param": SAMPLER_PARAM,
}
_LEGACY_KEYS = {
    "http.status_code": HTTP_STATUS,
    "code.function": CODE_FUNC,
    "code.filepath": CODE_FILE,
    "code.lineno": CODE_LINE,
    "db.system": DB_SYSTEM,
    "db.statement": DB_TEXT,
    "db.name": DB_NS,
    "db.sql.table": DB_COLL,
    "db.operation": DB_OP,
}
RESOURCE_KEYS = {
    "service.name": 0,
    "service.version": 1,
    "deployment.environment.name": 2,
    "vcs.ref.head.revision": 3,
    "deployment.environment": 4,  # older name of slot 2
    "vcs.repository.ref.revision": 5,  # older name of slot 3
    "oci.manifest.digest": 6,  # the build's image, when neither service.version nor a commit names it
    "container.image.repo_digests": 7,
    "container.image.id": 8,
}
EXCEPTION_KEYS = {"exception.type": 0, "exception.message": 1, "exception.stacktrace": 2}
LOG_KEYS = {"event.name": 0, "exception.type": 1}

KINDS: dict[int | str, SpanKind] = {k.value: k for k in SpanKind}
KINDS.update({"SPAN_KIND_" + k.name: k for k in SpanKind})
STATUSES: dict[int | str, StatusCode] = {s.value: s for s in StatusCode}
STATUSES.update({"STATUS_CODE_" + s.name: s for s in StatusCode})


@functools.lru_cache(maxsize=16)
def span_keys(opts: DecodeOptions) -> dict[str, int]:
    """Span attribute key → slot, for the given options."""
    keys = {k: slot + N for k, slot in _LEGACY_KEYS.items()}
    keys.update(_CURRENT_KEYS)
    keys[opts.tx_id_attribute] = TX_ID
    keys[opts.row_version_attribute] = ROW_VERSION
    keys[opts.idempotency_key_attribute] = IDEM_KEY
    return keys


def sampling_of(tracestate: str, vals: list[Any] | None) -> Sampling:
    """A span's sampling from its tracestate and, when that states none, its Jaeger sampler attributes."""
    if not tracestate and (vals is None or vals[SAMPLER_TYPE] is None):
        return UNKNOWN
    return span_sampling(tracestate, *((None, None) if vals is None else (vals[SAMPLER_TYPE], vals[SAMPLER_PARAM])))


def repo_digest(value: Any) -> str:
    """The digest of the first ``container.image.repo_digests`` entry (``repo@sha256:...`` -> ``sha256:...``)."""
    first = value[0] if isinstance(value, list) and value else value
    return to_text(first).rpartition("@")[2][:256] if isinstance(first, str) else ""


def to_int(value: Any) -> int:
    """A plain value as an int (0 when it is not one)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return 0
    if isinstance(value, float) and value == value and abs(value) < 2**63:
        return int(value)
    return 0


def is_db(vals: list[Any]) -> bool:
    """Whether the slots name a DB system or query text (a DB client span)."""
    return bool(vals[DB_SYSTEM] or vals[DB_SYSTEM + N] or vals[DB_TEXT] or vals[DB_TEXT + N])


class Extractor:
    """Per-call state (options, stats, key table) and the slot → field conversions."""

    __slots__ = ("keys", "limit", "quarter", "stats")

    def __init__(self, opts: DecodeOptions, stats: DecodeStats | None) -> None:
        self.keys = span_keys(opts)
        self.limit = opts.max_attribute_bytes
        self.quarter = opts.max_attribute_bytes // 4  # a str this short cannot exceed limit in UTF-8
        self.stats = stats

    def clip(self, s: str) -> str:
        """``s`` cut to ``max_attribute_bytes`` UTF-8 bytes; cuts are counted."""
        if len(s) <= self.quarter:
            return s
        raw = s.encode("utf-8", "surrogatepass")
        if len(raw) <= self.limit:
            return s
        if self.stats is not None:
            self.stats.truncated_attributes += 1
        return raw[: self.limit].decode("utf-8", "ignore")

    def text(self, value: Any) -> str:
        """A plain value as bounded text."""
        return self.clip(to_text(value))

    def scalar(self, value: Any) -> Scalar:
        """A plain value as a bounded ``Scalar``."""
        v = plain_scalar(value)
        return self.clip(v) if isinstance(v, str) else v

    def resource(self, vals: list[Any] | None) -> Resource:
        """A ``Resource`` from ``RESOURCE_KEYS`` slots."""
        if vals is None:
            return Resource(service="")
        text = self.text
        env = vals[2] if vals[2] is not None else vals[4]
        version, revision = text(vals[1]), text(vals[3] if vals[3] is not None else vals[5])
        digest = text(vals[6]) or repo_digest(vals[7]) or text(vals[8])
        return Resource(text(vals[0]), build_identity(version, revision, digest), text(env), revision, digest)

    def span_fields(self, vals: list[Any]) -> tuple[str, int, str, str, int, str]:
        """(route, http_status, code_function, code_file, code_line, idempotency_key) from span slots.

        Strings in ``vals`` are already clipped (see ``clip``); anything else goes the slow way.
        """
        route = vals[ROUTE] or ""
        status = vals[HTTP_STATUS] or vals[HTTP_STATUS + N] or 0
        function = vals[CODE_FUNC]
        if not function:
            function = vals[CODE_FUNC + N] or ""
            if function and vals[CODE_NS]:
                function = self.text(f"{to_text(vals[CODE_NS])}.{to_text(function)}")
        file = vals[CODE_FILE] or vals[CODE_FILE + N] or ""
        line = vals[CODE_LINE] or vals[CODE_LINE + N] or 0
        key = vals[IDEM_KEY] or ""
        if type(status) is not int or type(line) is not int:
            status, line = to_int(status), to_int(line)
        if type(route) is not str or type(function) is not str or type(file) is not str or type(key) is not str:
            route, function, file, key = self.text(route), self.text(function), self.text(file), self.text(key)
        return route, status, function, file, line, key

    def db_call(self, vals: list[Any], qparams: Iterable[tuple[str, Any]]) -> DbCall:
        """The ``DbCall`` of a span for which ``is_db(vals)``; ``qparams`` are ``db.query.parameter.*``."""
        params: tuple[Scalar, ...] = ()
        named: tuple[tuple[str, Scalar], ...] = ()
        raw = vals[DB_PARAMS]
        if isinstance(raw, list):  # recorded as an array attribute
            params = tuple(map(self.scalar, raw))
        elif raw is not None:  # values parsed from a clipped string need no clipping (a short str is its own text)
            params, named = literal_params(raw if type(raw) is str and len(raw) <= self.quarter else self.text(raw))
        positional: list[tuple[int, Any]] = []
        for name, value in qparams:
            if name.isdecimal() and len(name) < 10:
                positional.append((int(name), value))
            else:
                named += ((self.clip(name), self.scalar(value)),)
        if positional:
            positional.sort(key=lambda p: p[0])
            params = tuple([self.scalar(v) for _, v in positional])
        system = vals[DB_SYSTEM] or vals[DB_SYSTEM + N] or ""
        statement = vals[DB_TEXT] or vals[DB_TEXT + N] or ""
        namespace = vals[DB_NS] or vals[DB_NS + N] or ""
        collection = vals[DB_COLL] or vals[DB_COLL + N] or ""
        operation = vals[DB_OP] or vals[DB_OP + N] or ""
        if not (
            type(system) is str
            and type(statement) is str
            and type(namespace) is str
            and type(collection) is str
            and type(operation) is str
        ):
            system, statement, namespace, collection, operation = map(
                self.text, (system, statement, namespace, collection, operation)
            )
        tx_id, row_version = vals[TX_ID], vals[ROW_VERSION]  # ints are common: stringify
        tx_id = tx_id if type(tx_id) is str else "" if tx_id is None else self.text(tx_id)
        row_version = row_version if type(row_version) is str else "" if row_version is None else self.text(row_version)
        return _new_db_call(system, statement, namespace, collection, operation, params, named, tx_id, row_version)


NO_FIELDS = ("", 0, "", "", 0, "")
