"""Per CDC topic (one table each): the converter form, the before images, the trace column and the decimals.

The raw message says what the converter sent: Debezium's envelope (``op``, ``source``, ``before``, ``after``), the
unwrapped row of ``ExtractNewRecordState``, or a schema-registry frame (magic byte 0); with ``schemas.enable`` the
schema, whose ``org.apache.kafka.connect.data.Decimal`` fields are precise decimals (base64 bytes whose scale is in
the schema). The decoded ``RowChange`` says what the daemon made of it. An update without a before image, or a delete
whose before image holds only the key, means the table's ``REPLICA IDENTITY`` is not ``FULL``.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from processors.model.events import CdcOp, RowChange
from streamer.doctor import fixes
from streamer.doctor.report import Finding, Status

DECIMALS = ("org.apache.kafka.connect.data.Decimal", "io.debezium.data.VariableScaleDecimal")
MAX_COLUMNS = 512


@dataclass(slots=True)
class TableStats:
    """What one CDC topic's sampled messages carried."""

    table: str = ""  # schema.table, from the first decoded change
    changes: int = 0
    ops: Counter[str] = field(default_factory=Counter)
    forms: Counter[str] = field(default_factory=Counter)  # envelope | unwrapped | registry | other
    schemas: Counter[bool] = field(default_factory=Counter)
    updates_deletes: int = 0
    no_before: int = 0  # updates without a before image
    key_only_before: int = 0  # updates/deletes whose before image has nothing but the key
    columns: set[str] = field(default_factory=set)
    decimals: set[str] = field(default_factory=set)  # precise decimal columns (from the schema)
    decimals_as_text: int = 0  # ... whose decoded value is still text


def _form(value: bytes) -> tuple[str, bool, Any]:
    """(form, schemas on, schema) of a raw CDC value."""
    if value[:1] == b"\x00" and len(value) > 5:
        return "registry", False, None
    try:
        doc = json.loads(value)
    except ValueError:
        return "other", False, None
    schema = None
    if isinstance(doc, dict) and doc.keys() == {"schema", "payload"}:
        schema, doc = doc["schema"], doc["payload"]
    if not isinstance(doc, dict):
        return "other", schema is not None, schema
    return ("envelope" if "op" in doc and "source" in doc else "unwrapped"), schema is not None, schema


def _decimal_fields(schema: Any) -> set[str]:
    """The precise decimal columns named in a Connect JSON schema (envelope or unwrapped)."""
    out: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("name") in DECIMALS and isinstance(node.get("field"), str):
                out.add(node["field"])
            stack.extend(node.get("fields") or ())
    return out


class TableCensus:
    """Sums raw CDC messages and their decoded changes per topic."""

    def __init__(self) -> None:
        self.topics: dict[str, TableStats] = {}

    def add(self, topic: str, value: bytes | None, change: RowChange | None) -> None:
        """One message: its raw value (None for a tombstone) and the change the decoder made of it (None: none)."""
        t = self.topics.setdefault(topic, TableStats())
        if value:
            form, schemas, schema = _form(value)
            t.forms[form] += 1
            t.schemas[schemas] += 1
            if schema is not None:
                t.decimals |= _decimal_fields(schema)
        if change is None:
            return
        t.table = t.table or change.table
        t.changes += 1
        t.ops[change.op.value] += 1
        row = change.after if change.after is not None else change.before
        if row and len(t.columns) < MAX_COLUMNS:
            t.columns.update(row)
        if change.op in (CdcOp.UPDATE, CdcOp.DELETE):
            t.updates_deletes += 1
            key = {k for k, _ in change.key}
            if change.before is None:
                t.no_before += 1
            elif all(v is None for c, v in change.before.items() if c not in key):
                t.key_only_before += 1
        t.decimals_as_text += sum(isinstance((change.after or {}).get(c), str) for c in t.decimals)


FORMS = {"envelope": "Debezium envelope (JSON)", "unwrapped": "unwrapped rows (ExtractNewRecordState)",
         "registry": "schema-registry frames (Avro / Protobuf)", "other": "not Debezium JSON"}  # fmt: skip


def findings(topic: str, t: TableStats, undecodable: dict[str, int], trace_column: str) -> list[Finding]:
    """The findings of one CDC topic."""
    subject = f"table {t.table or '?'} ({topic})"
    table = t.table or topic
    out: list[Finding] = []
    forms = ", ".join(f"{FORMS[f]} x{n}" for f, n in t.forms.most_common())
    schemas = "schemas from the registry" if t.forms["registry"] else "schemas on" if t.schemas[True] else "schemas off"
    if undecodable:
        reasons = ", ".join(f"{r} x{n}" for r, n in undecodable.items())
        status = Status.PARTIAL if t.changes else Status.MISSING
        detail = f"{forms}; the daemon could not decode: {reasons}"
        out.append(Finding(subject, "cdc: converter form", status, detail, fixes.CDC_ENVELOPE))
    else:
        out.append(Finding(subject, "cdc: converter form", Status.OK, f"{forms}; {schemas}"))
    if not t.changes:
        return out
    ops = " ".join(f"{op}:{n}" for op, n in sorted(t.ops.items()))
    out.append(Finding(subject, "cdc: captured", Status.OK, f"{t.changes} change(s) ({ops})"))
    partial = t.no_before + t.key_only_before
    if t.forms["unwrapped"] and not t.forms["envelope"]:
        out.append(Finding(subject, "cdc: before images", Status.MISSING, "unwrapped rows carry no before image "
                           "(ExtractNewRecordState keeps the after image only)", fixes.CDC_ENVELOPE))  # fmt: skip
    elif not t.updates_deletes:
        out.append(Finding(subject, "cdc: before images", Status.PARTIAL,
                           "no update or delete in the sample: replica identity not seen"))  # fmt: skip
    else:
        detail = (f"{partial} of {t.updates_deletes} update(s)/delete(s) without a full before image "
                  f"({t.no_before} none, {t.key_only_before} key only): REPLICA IDENTITY is not FULL" if partial else
                  f"{t.updates_deletes} update(s)/delete(s), each with a full before image")  # fmt: skip
        out.append(Finding(subject, "cdc: before images", Status.OK if not partial else Status.MISSING, detail,
                           fixes.CDC_BEFORE.format(table=table)))  # fmt: skip
    if trace_column in t.columns:
        out.append(Finding(subject, "cdc: trace column", Status.OK, f"column {trace_column} present"))
    else:
        out.append(Finding(subject, "cdc: trace column", Status.PARTIAL,
                           f"no {trace_column} column: changes are credited by transaction id or values and time",
                           fixes.CDC_TRACE_COLUMN))  # fmt: skip
    if t.decimals:
        cols = ", ".join(sorted(t.decimals))
        status, how = (Status.PARTIAL, "arrive as base64 text and are kept as text") if t.decimals_as_text else (
            Status.OK, "are decoded as numbers")  # fmt: skip
        out.append(Finding(subject, "cdc: decimals", status, f"precise decimals ({cols}) {how}", fixes.CDC_DECIMAL))
    return out


def uncaptured(written: dict[str, set[str]], tables: list[TableStats]) -> list[Finding]:
    """Tables the services write that no sampled CDC topic carries (by table name, schema aside)."""
    captured = {t.table.rsplit(".", 1)[-1] for t in tables if t.table}
    out = []
    for table in sorted(set().union(*written.values()) - captured) if written else ():
        writers = ", ".join(sorted(s for s, ts in written.items() if table in ts))
        out.append(Finding(f"table {table}", "cdc: captured", Status.MISSING,
                           f"written by {writers}, but no CDC topic matching kafka.cdc_pattern carries it",
                           fixes.CDC_CAPTURE))  # fmt: skip
    return out
