"""Frozen values made at a fraction of their constructors' cost, for the decoders' hot path.

A frozen slotted dataclass's ``__init__`` sets each field through ``object.__setattr__`` (a ``DbCall``: nine); a
twin of the same slots fills them with plain stores and then becomes one (same layout, as
``processors.model.span._SpanBuilder`` makes a ``Span``). The result is that class's instance: it equals, hashes,
prints and pickles as one made by its constructor (``tests/decode/test_otlp_known_spans``).
"""

from __future__ import annotations

from typing import Any

from processors.model.events import DbCall, Scalar

_DB_FIELDS = ("system", "statement", "namespace", "collection", "operation", "params", "named_params", "tx_id",
              "row_version")  # fmt: skip
if DbCall.__slots__ != _DB_FIELDS:
    raise TypeError(f"DbCall's fields are {DbCall.__slots__}: new_db_call sets {_DB_FIELDS}")


class _DbCallBuilder:
    __slots__ = DbCall.__slots__

    def __init__(self, system: str, statement: str, namespace: str, collection: str, operation: str,
                 params: tuple[Scalar, ...], named_params: tuple[tuple[str, Scalar], ...], tx_id: str,
                 row_version: str) -> None:  # fmt: skip
        self.system = system
        self.statement = statement
        self.namespace = namespace
        self.collection = collection
        self.operation = operation
        self.params = params
        self.named_params = named_params
        self.tx_id = tx_id
        self.row_version = row_version


def new_db_call(system: str, statement: str, namespace: str, collection: str, operation: str,
                params: tuple[Scalar, ...], named_params: tuple[tuple[str, Scalar], ...], tx_id: str,
                row_version: str) -> DbCall:  # fmt: skip
    """``DbCall(system, ..., row_version)`` (every field given)."""
    call: Any = _DbCallBuilder(system, statement, namespace, collection, operation, params, named_params, tx_id,
                               row_version)  # fmt: skip
    call.__class__ = DbCall
    return call  # type: ignore[no-any-return]
