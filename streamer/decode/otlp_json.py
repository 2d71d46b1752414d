"""The OTel collector's ``otlp_json`` encoding (OTLP/JSON) → ``Span`` / ``LogRecord`` events.

OTLP/JSON writes trace and span ids as hex, not base64, so ``google.protobuf.json_format`` would silently
decode them to garbage; the documents are walked by hand instead. camelCase keys are canonical, snake_case
ones are accepted too. int64 values may be JSON numbers or decimal strings; enums numbers or names.
"""

from __future__ import annotations

import base64
import binascii
import sys
from collections.abc import Callable, Iterator
from typing import Any

from processors.model.events import LogRecord, Resource, SpanKind, StatusCode
from processors.model.span import Span
from streamer.decode._attrs import (
    DEFAULT_OPTIONS,
    EXCEPTION_EVENT,
    EXCEPTION_KEYS,
    KINDS,
    LOG_KEYS,
    MAX_DEPTH,
    NO_FIELDS,
    QUERY_PARAM,
    RESOURCE_KEYS,
    SPAN_SLOTS,
    STATUSES,
    TEXT_SLOTS,
    DecodeOptions,
    DecodeStats,
    Extractor,
    is_db,
    sampling_of,
)
from streamer.decode.errors import DecodeError
from streamer.decode.jsontext import loads

__all__ = ["decode_logs_json", "decode_traces_json"]

_INVALID = "otlp_json_invalid"
_INT_DIGITS = sys.int_info.default_max_str_digits
_Names = tuple[str, str]  # (camelCase, snake_case)
_RESOURCE_SPANS: _Names = ("resourceSpans", "resource_spans")
_SCOPE_SPANS: _Names = ("scopeSpans", "scope_spans")
_SPANS: _Names = ("spans", "spans")
_RESOURCE_LOGS: _Names = ("resourceLogs", "resource_logs")
_SCOPE_LOGS: _Names = ("scopeLogs", "scope_logs")
_LOG_RECORDS: _Names = ("logRecords", "log_records")
_EVENTS: _Names = ("events", "events")
_LINKS: _Names = ("links", "links")
_TRACE_ID: _Names = ("traceId", "trace_id")
_SPAN_ID: _Names = ("spanId", "span_id")
_PARENT_ID: _Names = ("parentSpanId", "parent_span_id")
_START: _Names = ("startTimeUnixNano", "start_time_unix_nano")
_END: _Names = ("endTimeUnixNano", "end_time_unix_nano")
_TIME: _Names = ("timeUnixNano", "time_unix_nano")
_OBSERVED: _Names = ("observedTimeUnixNano", "observed_time_unix_nano")
_SEVERITY_NUMBER: _Names = ("severityNumber", "severity_number")
_SEVERITY_TEXT: _Names = ("severityText", "severity_text")
_EVENT_NAME: _Names = ("eventName", "event_name")
_VALUE_KINDS = {
    name: kind
    for kind, camel, snake in (
        ("s", "stringValue", "string_value"),
        ("i", "intValue", "int_value"),
        ("b", "boolValue", "bool_value"),
        ("d", "doubleValue", "double_value"),
        ("y", "bytesValue", "bytes_value"),
        ("a", "arrayValue", "array_value"),
        ("k", "kvlistValue", "kvlist_value"),
    )
    for name in (camel, snake)
}
_SEVERITIES: dict[int | str, int] = {
    f"SEVERITY_NUMBER_{name}{n or ''}": 4 * i + (n or 1)
    for i, name in enumerate(("TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL"))
    for n in (0, 2, 3, 4)
}
_SEVERITIES["SEVERITY_NUMBER_UNSPECIFIED"] = 0


def _get(obj: dict[str, Any], names: _Names) -> Any:
    v = obj.get(names[0])
    return obj.get(names[1]) if v is None else v


def _obj(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise DecodeError(_INVALID, f"{where} is not an object")
    return value


def _list(obj: dict[str, Any], names: _Names, where: str) -> list[Any]:
    v = _get(obj, names)
    if v is None:
        return []
    if not isinstance(v, list):
        raise DecodeError(_INVALID, f"{where}.{names[0]} is not a list")
    return v


def _utf8(s: str) -> str:
    """``s`` with lone surrogates (valid JSON escapes, but not UTF-8, which protobuf enforces) replaced."""
    return s if s.isascii() else s.encode("utf-8", "replace").decode("utf-8")


def _str(obj: dict[str, Any], names: _Names, where: str) -> str:
    v = _get(obj, names)
    if v is None:
        return ""
    if not isinstance(v, str):
        raise DecodeError(_INVALID, f"{where}.{names[0]} is not a string")
    return _utf8(v)


def _trace_state(sp: dict[str, Any]) -> str:
    """The span's W3C tracestate; anything but text reads as none (it only ever informs, never refuses a span)."""
    v = _get(sp, ("traceState", "trace_state"))
    return _utf8(v) if isinstance(v, str) else ""


def _int(value: Any, where: str) -> int:
    """An int64 field: a JSON integer or a decimal string."""
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise DecodeError(_INVALID, f"{where} is not an integer: {value!r:.40}")


def _enum(value: Any, table: dict[int | str, Any], default: Any, where: str) -> Any:
    """An enum field given as its number or its name."""
    if value is None:
        return default
    if isinstance(value, int) and not isinstance(value, bool):
        return table.get(value, default)
    if isinstance(value, str) and value in table:
        return table[value]
    raise DecodeError(_INVALID, f"{where} is not a known enum value: {value!r:.40}")


def _id(value: Any, size: int, where: str, *, optional: bool = False) -> str:
    """A ``size``-byte id written as hex, as lowercase hex ("" when optional and absent or empty)."""
    if optional and (value is None or value == ""):
        return ""
    if isinstance(value, str) and len(value) == 2 * size:
        try:
            raw = bytes.fromhex(value)
        except ValueError:
            raw = b""
        if len(raw) == size:
            return raw.hex()
    raise DecodeError("otlp_invalid_id", f"{where} is not {2 * size} hex characters: {value!r:.50}")


def _value(value: Any, where: str, depth: int = 0) -> Any:
    """An OTLP/JSON ``AnyValue`` as a plain value, exactly as the protobuf decoder gives it."""
    if value is None or value == {}:
        return None
    if not isinstance(value, dict) or len(value) != 1:
        raise DecodeError(_INVALID, f"{where} is not an AnyValue object")
    ((name, v),) = value.items()
    kind = _VALUE_KINDS.get(name)
    if kind == "s" and isinstance(v, str):
        return _utf8(v)
    if kind == "i":
        digits = v.removeprefix("-") if isinstance(v, str) else ""
        if len(digits) > _INT_DIGITS and digits.isascii() and digits.isdigit():
            return v  # an integer Python will not read (past the int-string limit): its text, as for parameters
        return _int(v, where)
    if kind == "b" and isinstance(v, bool):
        return v
    if kind == "d" and isinstance(v, int | float | str) and not isinstance(v, bool):
        try:
            return float(v)  # also "NaN", "Infinity"
        except ValueError:
            pass
    elif kind == "y" and isinstance(v, str):
        try:
            return base64.b64decode(v, validate=True).hex()
        except (binascii.Error, ValueError):
            pass
    elif kind in ("a", "k") and isinstance(v, dict):
        if depth >= MAX_DEPTH:
            return None
        items = _list(v, ("values", "values"), where)
        if kind == "a":
            return [_value(x, where, depth + 1) for x in items]
        pairs = [_obj(x, where) for x in items]
        return {_utf8(str(p.get("key", ""))): _value(p.get("value"), where, depth + 1) for p in pairs}
    raise DecodeError(_INVALID, f"{where} has an invalid {name!r:.40}")


def _attributes(obj: dict[str, Any], where: str) -> list[tuple[str, Any]]:
    """The (key, raw JSON value) pairs of ``obj['attributes']``."""
    attrs = _list(obj, ("attributes", "attributes"), where)
    pairs = []
    for kv in attrs:
        if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
            raise DecodeError(_INVALID, f"{where}.attributes has an entry without a string key")
        pairs.append((kv["key"], kv.get("value")))
    return pairs


def _pick(
    pairs: list[tuple[str, Any]],
    keys: dict[str, int],
    size: int,
    where: str,
    clip: Callable[[str], str] | None = None,
    text_slots: frozenset[int] = frozenset(),
) -> list[Any] | None:
    """Plain values of the wanted keys by slot (strings bounded by ``clip``), or None when none is present."""
    vals: list[Any] | None = None
    for key, raw in pairs:
        slot = keys.get(key)
        if slot is not None:
            if vals is None:
                vals = [None] * size
            v = _value(raw, f"{where} attribute {key!r}")
            if slot in text_slots and isinstance(raw, dict) and "bytesValue" in raw and isinstance(v, str):
                v = bytes.fromhex(v).decode("utf-8", "replace")  # as the protobuf decoder: SQL sent as bytes
            vals[slot] = clip(v) if clip is not None and type(v) is str else v
    return vals


def _load(data: bytes, opts: DecodeOptions) -> dict[str, Any]:
    if not data:
        raise DecodeError("empty_value", "empty message value")
    if len(data) > opts.max_message_bytes:
        raise DecodeError("oversize_message", f"{len(data)} bytes > {opts.max_message_bytes}")
    return _obj(loads(data, _INVALID, "message"), "message")


def _resource(ext: Extractor, obj: dict[str, Any], where: str) -> Resource:
    res = obj.get("resource")
    if res is None:
        return ext.resource(None)
    pairs = _attributes(_obj(res, where), where)
    return ext.resource(_pick(pairs, RESOURCE_KEYS, len(RESOURCE_KEYS), where))


def _span(ext: Extractor, sp: dict[str, Any], resource: Resource, where: str) -> Span:
    pairs = _attributes(sp, where)
    vals = _pick(pairs, ext.keys, SPAN_SLOTS, where, ext.clip, TEXT_SLOTS)
    fields = NO_FIELDS if vals is None else ext.span_fields(vals)
    db = None
    if vals and is_db(vals):
        qparams = [(_utf8(k[len(QUERY_PARAM) :]), _value(v, k)) for k, v in pairs if k.startswith(QUERY_PARAM)]
        db = ext.db_call(vals, qparams)
    exc_type = exc_message = exc_stack = ""
    for ev in _list(sp, _EVENTS, where):
        ev = _obj(ev, f"{where} event")
        if ev.get("name") == EXCEPTION_EVENT:
            exc = _pick(_attributes(ev, where), EXCEPTION_KEYS, len(EXCEPTION_KEYS), f"{where} exception event")
            if exc is not None:
                exc_type, exc_message, exc_stack = ext.text(exc[0]), ext.text(exc[1]), ext.text(exc[2])
            break
    links = tuple(
        _id(_get(_obj(link, f"{where} link"), _TRACE_ID), 16, f"{where} link traceId")
        for link in _list(sp, _LINKS, where)
    )
    status = _obj(sp.get("status") or {}, f"{where}.status")
    return Span(
        trace_id=_id(_get(sp, _TRACE_ID), 16, f"{where}.traceId"),
        span_id=_id(_get(sp, _SPAN_ID), 8, f"{where}.spanId"),
        parent_id=_id(_get(sp, _PARENT_ID), 8, f"{where}.parentSpanId", optional=True),
        name=ext.clip(_str(sp, ("name", "name"), where)),
        kind=_enum(sp.get("kind"), KINDS, SpanKind.UNSPECIFIED, f"{where}.kind"),
        start_ns=_int(_get(sp, _START), f"{where}.startTimeUnixNano"),
        end_ns=_int(_get(sp, _END), f"{where}.endTimeUnixNano"),
        status=_enum(status.get("code"), STATUSES, StatusCode.UNSET, f"{where}.status.code"),
        resource=resource,
        route=fields[0],
        http_status=fields[1],
        exception_type=exc_type,
        exception_message=exc_message,
        code_function=fields[2],
        code_file=fields[3],
        code_line=fields[4],
        db=db,
        links=links,
        idempotency_key=fields[5],
        exception_stacktrace=exc_stack,
        sampling=sampling_of(_trace_state(sp), vals),
    )


# (resource level, scope level, item level) key names, as camelCase and snake_case pairs.
_TRACES = (_RESOURCE_SPANS, _SCOPE_SPANS, _SPANS)
_LOGS = (_RESOURCE_LOGS, _SCOPE_LOGS, _LOG_RECORDS)


def _items(
    doc: dict[str, Any], ext: Extractor, levels: tuple[_Names, _Names, _Names]
) -> Iterator[tuple[Resource, dict[str, Any], str]]:
    """Every span (or log record) of an OTLP/JSON document with its resource and its JSON path, for errors."""
    outer, scope, item = levels
    for i, rs in enumerate(_list(doc, outer, "message")):
        where = f"{outer[0]}[{i}]"
        rs = _obj(rs, where)
        resource = _resource(ext, rs, f"{where}.resource")
        for j, ss in enumerate(_list(rs, scope, where)):
            swhere = f"{where}.{scope[0]}[{j}]"
            for k, it in enumerate(_list(_obj(ss, swhere), item, swhere)):
                iwhere = f"{swhere}.{item[0]}[{k}]"
                yield resource, _obj(it, iwhere), iwhere


def decode_traces_json(
    data: bytes, opts: DecodeOptions = DEFAULT_OPTIONS, stats: DecodeStats | None = None
) -> list[Span]:
    """Decode an OTLP/JSON traces document (the collector's ``otlp_json``, hex ids) into spans."""
    doc = _load(data, opts)
    ext = Extractor(opts, stats)
    out = [_span(ext, sp, resource, where) for resource, sp, where in _items(doc, ext, _TRACES)]
    if stats is not None:
        stats.spans += len(out)
    return out


def _log(ext: Extractor, lr: dict[str, Any], resource: Resource, where: str) -> LogRecord:
    attrs = _pick(_attributes(lr, where), LOG_KEYS, 2, where) or [None, None]
    severity = _get(lr, _SEVERITY_NUMBER)
    if not isinstance(severity, int) or isinstance(severity, bool):  # unknown numbers pass, as in protobuf
        severity = _enum(severity, _SEVERITIES, 0, f"{where}.severityNumber")
    return LogRecord(
        time_ns=_int(_get(lr, _TIME), f"{where}.timeUnixNano")
        or _int(_get(lr, _OBSERVED), f"{where}.observedTimeUnixNano"),
        resource=resource,
        severity_number=severity,
        severity_text=ext.text(_str(lr, _SEVERITY_TEXT, where)),
        body=ext.text(_value(lr.get("body"), f"{where}.body")),
        event_name=ext.text(_str(lr, _EVENT_NAME, where) or attrs[0]),
        trace_id=_id(_get(lr, _TRACE_ID), 16, f"{where}.traceId", optional=True),
        span_id=_id(_get(lr, _SPAN_ID), 8, f"{where}.spanId", optional=True),
        exception_type=ext.text(attrs[1]),
    )


def decode_logs_json(
    data: bytes, opts: DecodeOptions = DEFAULT_OPTIONS, stats: DecodeStats | None = None
) -> list[LogRecord]:
    """Decode an OTLP/JSON logs document (the collector's ``otlp_json``, hex ids) into log records."""
    doc = _load(data, opts)
    ext = Extractor(opts, stats)
    out = [_log(ext, lr, resource, where) for resource, lr, where in _items(doc, ext, _LOGS)]
    if stats is not None:
        stats.log_records += len(out)
    return out
