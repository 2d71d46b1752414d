"""Names in the file sink: the file each kind of event goes to, and the id under which a replay is recognised.

One file per kind: ``incident`` -> ``incidents.jsonl`` (``<kind>s.jsonl``; a kind must be a safe file-name stem).
The id of an event is the values of the identity fields its model declares (``Published.identity``:
``IncidentEvent.occurrence``, ``VerdictEvent`` fingerprint + version + outcome, ...) for the kinds this process
knows (``processors.model.outputs.EVENT_TYPES``), else a hash of its whole JSON. Ids are per kind.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any, Final

from processors.model.outputs import EVENT_TYPES

_KIND: Final = re.compile(r"[a-z][a-z0-9_]{0,62}")
_SUFFIX: Final = "s.jsonl"
_SEP: Final = "\x1f"


def identity(kind: str) -> tuple[str, ...] | None:
    """The identity fields of ``kind``'s model, or None for a kind without (identified by its content)."""
    model = EVENT_TYPES.get(kind)
    return model.identity if model is not None and model.identity else None


def event_id(kind: str, doc: Mapping[str, Any]) -> str:
    """The id of one event of ``kind`` (its JSON object) under which a replay is recognised.

    The identity fields its model declares (``Published.identity``) for the kinds this process knows, else a
    hash of the whole event.
    """
    fields = identity(kind)
    if fields is not None:
        return _SEP.join(str(doc[f]) for f in fields)
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def file_name(kind: str) -> str:
    """The file of one kind of event: ``incident`` -> ``incidents.jsonl``."""
    if not _KIND.fullmatch(kind):
        raise ValueError(f"event kind {kind!r} is not a valid file name stem")
    return f"{kind}{_SUFFIX}"


def kind_of(name: str) -> str | None:
    """The kind whose file ``name`` is (``incidents.jsonl`` -> ``incident``), or None for any other file."""
    kind = name.removesuffix(_SUFFIX)
    return kind if kind != name and _KIND.fullmatch(kind) else None
