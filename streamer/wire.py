"""The internal stage-1 → stage-2 topic: ``Access`` and ``RowChange`` events as versioned JSON.

Keyed by entity key, so every event about one row lands in one partition and one stage-2 consumer.
"""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any

from streamer.events import Access, CdcOp, DbOperation, LockMode, RowChange

SCHEMA_VERSION = 1
_ACCESS_FIELDS = tuple(f.name for f in fields(Access))
_CHANGE_FIELDS = tuple(f.name for f in fields(RowChange))


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def encode_access(a: Access) -> bytes:
    body = {name: _plain(getattr(a, name)) for name in _ACCESS_FIELDS}
    return json.dumps({"v": SCHEMA_VERSION, "kind": "access", "access": body}, default=str).encode()


def encode_row_change(c: RowChange) -> bytes:
    body = {name: _plain(getattr(c, name)) for name in _CHANGE_FIELDS}
    return json.dumps({"v": SCHEMA_VERSION, "kind": "row_change", "change": body}, default=str).encode()


def _tuples(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{what} is not a JSON object")
    return value


def decode(data: bytes) -> Access | RowChange:
    """Back to events; raises ``ValueError`` (or ``KeyError``/``TypeError``) on anything malformed."""
    msg = _object(json.loads(data), "internal event")
    if msg.get("v") != SCHEMA_VERSION:
        raise ValueError(f"unsupported internal schema version {msg.get('v')!r}")
    if msg["kind"] == "access":
        raw = {k: _tuples(v) for k, v in _object(msg["access"], "access").items()}
        raw["operation"] = DbOperation(raw["operation"])
        raw["lock"] = LockMode(raw["lock"])
        return Access(**raw)
    if msg["kind"] == "row_change":
        raw = dict(_object(msg["change"], "change"))
        raw["op"] = CdcOp(raw["op"])
        raw["key"] = tuple((k, v) for k, v in raw["key"])
        return RowChange(**raw)
    raise ValueError(f"unknown internal event kind {msg['kind']!r}")
