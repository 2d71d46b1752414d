"""Transaction-control statements as drivers send them: ``BEGIN;``, ``COMMIT;``, ``SAVEPOINT sa_savepoint_1``.

asyncpg sends ``BEGIN;`` / ``COMMIT;`` / ``ROLLBACK;`` and ``SAVEPOINT __asyncpg_savepoint_1__;`` through the calls its
instrumentation traces, so they are spans; SQLAlchemy (``SAVEPOINT sa_savepoint_1``, ``RELEASE SAVEPOINT ...``) and
Django (``SAVEPOINT "s140...x1"``) send savepoints through the cursor, but BEGIN and COMMIT through the DB-API
connection, which no instrumentation traces. These statements touch no row: the access extractor counts them
``not_dml`` without parsing them (sqlglot reads SAVEPOINT only as an opaque command, logging a warning per new
savepoint name). Read from its tokens, by sqlglot's tokenizer (comments before the keyword are skipped); a lone
statement only (``BEGIN; UPDATE ...`` is two).
"""

from __future__ import annotations

from typing import Final

from sqlglot import Token, TokenType
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import TokenError

from processors.sql.syntax import DIALECT

BEGIN: Final = "begin"
COMMIT: Final = "commit"
ROLLBACK: Final = "rollback"
SAVEPOINT: Final = "savepoint"
RELEASE: Final = "release"
ROLLBACK_TO: Final = "rollback_to"  # ROLLBACK TO [SAVEPOINT] name: undoes the savepoint's work, not the transaction's

_LONGEST: Final = 512  # longer text is no lone transaction-control statement (it is parsed as any other)
_FIRST: Final = {
    "BEGIN": BEGIN,
    "START": BEGIN,  # START TRANSACTION
    "COMMIT": COMMIT,
    "END": COMMIT,
    "ROLLBACK": ROLLBACK,
    "ABORT": ROLLBACK,
    "SAVEPOINT": SAVEPOINT,
    "RELEASE": RELEASE,
}
_COMMENTS: Final = frozenset({"/*", "--"})
_PREPARED: Final = frozenset({"PREPARED", "PREPARE"})  # two-phase commit: not this session's transaction boundary


def transaction_control(statement: str) -> str | None:
    """``begin`` / ``commit`` / ``rollback`` / ``savepoint`` / ``release`` / ``rollback_to``, or None for any other
    statement (including ``SET TRANSACTION ...`` and two-phase ``COMMIT PREPARED``, which end nothing here)."""
    if not statement or len(statement) > _LONGEST:
        return None
    head = statement.lstrip()
    words = head[:10].split(None, 1)  # the longest keyword, SAVEPOINT, has 9 letters
    if not words or (head[:2] not in _COMMENTS and words[0].rstrip(";").upper() not in _FIRST):
        return None  # the common case, decided without the tokenizer (the transactions of every trace ask)
    try:
        tokens = Dialect.get_or_raise(DIALECT).tokenize(statement)
    except TokenError:  # text that is not SQL
        return None
    ends = [i for i, t in enumerate(tokens) if t.token_type is TokenType.SEMICOLON]
    if not tokens or (ends and ends[0] != len(tokens) - 1):
        return None  # `BEGIN; UPDATE ...`: more than one statement (counted multi_statement when parsed)
    kind = _FIRST.get(tokens[0].text.upper())
    if kind is None or (kind == BEGIN and tokens[0].text.upper() == "START" and not _next_is(tokens, "TRANSACTION")):
        return None
    if len(tokens) > 1 and tokens[1].text.upper() in _PREPARED:
        return None
    if kind == ROLLBACK and _next_is(tokens, "TO"):
        return ROLLBACK_TO
    if tokens[0].token_type is TokenType.END and not (
        len(tokens) == 1 or tokens[1].token_type is TokenType.SEMICOLON or tokens[1].text.upper() in _WORK
    ):
        return None  # END followed by anything else is not PostgreSQL's COMMIT
    return kind


_WORK: Final = frozenset({"TRANSACTION", "WORK"})


def _next_is(tokens: list[Token], word: str) -> bool:
    return len(tokens) > 1 and tokens[1].text.upper() == word


__all__ = ["BEGIN", "COMMIT", "RELEASE", "ROLLBACK", "ROLLBACK_TO", "SAVEPOINT", "transaction_control"]
