"""What a FalkorDB error means for the rows of the statement that met it: :func:`classify`.

The first rule of :data:`RULES` that matches the exception's type and text wins:

======================================================================  =========  =================================
error: a redis-py type, or the text of a ``ResponseError``              handling   why
======================================================================  =========  =================================
``ConnectionError`` (refused, reset, ``LOADING``, ``NOAUTH``,           transient  the server is down, restarting,
``WRONGPASS``, too many clients), socket ``TimeoutError``, ``OSError``  +reconnect loading, unreachable, or refuses
                                                                                   the credentials (an operator's fix)
``READONLY``, ``TRYAGAIN``, ``CLUSTERDOWN``, ``MASTERDOWN``             transient  a replica, resharding or failover
``MISCONF`` (persistence failing), ``NOREPLICAS`` (``min-replicas``)    transient  the server refuses writes it could
                                                                                   not keep: wait until it can
``OOM`` (maxmemory), ``Out of memory``, ``BUSY``                        transient  memory, or a blocking script
``NOPERM``                                                              transient  ACLs: an operator's fix, not data
``Max pending queries exceeded``                                        transient  ``MAX_QUEUED_QUERIES``: overloaded
schema version mismatch (the falkordb client)                           transient  the client refreshed its schema
``Query timed out``, ``Query's mem consumption exceeded capacity``      shrink     ``TIMEOUT`` / ``QUERY_MEM_CAPACITY``:
                                                                                   too much in one statement
``Type mismatch``, ``Property values can only be``, ``null property     content    a value of the rows: FalkorDB
value``, ``constraint violation``; a parse error in the parameters                 refuses it whatever the server's
(``errCtx: CYPHER ...``); ``DataError``, ``ValueError``, ``TypeError``             state (the halving finds the row)
(the client cannot encode a value)
anything else (an unknown command, ``Unknown function``, a parse error  unknown    transient: the statement or the
in the statement, a server condition no rule names)                                server, never one row's content
======================================================================  =========  =================================

Only *content* errors are about a row: every rule there names something FalkorDB says of a value it was given. An
error a rule does not name is never taken for bad content (which would drop every row of the statement): it is
retried like a transient one, counted apart (``unknown_errors``) and logged, and the daemon pauses until it passes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import redis.exceptions
from falkordb.exceptions import SchemaVersionMismatchException


class Handling(enum.Enum):
    """What the writer does about one error (see the module docstring)."""

    RECONNECT = "reconnect"  # transient, and the connection is suspect: drop it
    TRANSIENT = "transient"
    SHRINK = "shrink"  # transient, but the statement was too big for the server's per-query bounds
    CONTENT = "content"  # a row's value: isolate the row, dead-letter it
    UNKNOWN = "unknown"  # transient: retried without end, counted apart


@dataclass(frozen=True, slots=True)
class Rule:
    """One row of the classification table: an error matches when it is one of ``types`` (if any are given) and
    its text starts with one of ``codes`` or contains one of ``phrases`` (case-insensitive; if any are given)."""

    handling: Handling
    types: tuple[type[BaseException], ...] = ()
    codes: tuple[str, ...] = ()
    phrases: tuple[str, ...] = ()

    def matches(self, exc: BaseException, text: str) -> bool:
        if self.types and not isinstance(exc, self.types):
            return False
        if not self.codes and not self.phrases:
            return True
        head = text.split(" ", 1)[0].upper()
        return head in self.codes or any(p in text.lower() for p in self.phrases)


_RE = redis.exceptions
_SERVER_STATE = (_RE.ReadOnlyError, _RE.TryAgainError, _RE.ClusterDownError, _RE.OutOfMemoryError)
_SERVER_CODES = ("LOADING", "READONLY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "OOM", "BUSY", "NOPERM", "MISCONF",
                 "NOREPLICAS")  # fmt: skip
# What FalkorDB says of a value it was given; "errctx: cypher " is a parse error located in the parameter header
# (FalkorDB parses the header apart and quotes it from its start), not in the statement.
_CONTENT = ("type mismatch", "property values can only be", "null property value", "constraint violation",
            "errctx: cypher ")  # fmt: skip
RULES: tuple[Rule, ...] = (
    Rule(Handling.RECONNECT, (_RE.ConnectionError, _RE.TimeoutError, OSError, TimeoutError)),
    Rule(Handling.TRANSIENT, (*_SERVER_STATE, _RE.NoPermissionError, SchemaVersionMismatchException)),
    Rule(Handling.TRANSIENT, (_RE.ResponseError,), _SERVER_CODES, ("max pending queries exceeded", "out of memory")),
    Rule(Handling.SHRINK, (_RE.ResponseError,), phrases=("query timed out", "exceeded capacity")),
    Rule(Handling.CONTENT, (_RE.ResponseError,), phrases=_CONTENT),
    Rule(Handling.CONTENT, (_RE.DataError, ValueError, TypeError)),
)
CAUGHT = (_RE.RedisError, SchemaVersionMismatchException, OSError, TimeoutError, ValueError, TypeError)


def classify(exc: BaseException) -> Handling:
    """How the writer handles ``exc``: the first rule of :data:`RULES` that matches, else ``UNKNOWN``."""
    text = str(exc)
    for rule in RULES:
        if rule.matches(exc, text):
            return rule.handling
    return Handling.UNKNOWN


class Refused(Exception):
    """Internal to the writer: the statement failed in a way that splitting the rows may help (``handling`` says
    how)."""

    def __init__(self, handling: Handling, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.handling = handling
        self.cause = cause
