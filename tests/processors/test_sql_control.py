"""Transaction-control statements as drivers send them, told apart from everything else."""

from __future__ import annotations

import pytest

from processors.sql.control import BEGIN, COMMIT, RELEASE, ROLLBACK, ROLLBACK_TO, SAVEPOINT, transaction_control


@pytest.mark.parametrize(
    ("statement", "kind"),
    [
        ("BEGIN;", BEGIN),  # asyncpg
        ("begin isolation level serializable", BEGIN),
        ("START TRANSACTION ISOLATION LEVEL SERIALIZABLE", BEGIN),
        ("COMMIT;", COMMIT),
        ("END TRANSACTION", COMMIT),
        ("/* sqlcommenter */ COMMIT", COMMIT),
        ("ROLLBACK;", ROLLBACK),
        ("ABORT", ROLLBACK),
        ("SAVEPOINT sa_savepoint_1", SAVEPOINT),  # SQLAlchemy
        ('SAVEPOINT "s140658583448448_x1"', SAVEPOINT),  # Django
        ("SAVEPOINT __asyncpg_savepoint_10__;", SAVEPOINT),
        ("RELEASE SAVEPOINT sa_savepoint_1", RELEASE),
        ("ROLLBACK TO SAVEPOINT sa_savepoint_1", ROLLBACK_TO),
        ("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE", None),
        ("COMMIT PREPARED 'tx1'", None),
        ("PREPARE TRANSACTION 'tx1'", None),
        ("START_DATE", None),
        ("END IF", None),
        ("SELECT 1", None),
        ("UPDATE accounts SET balance = 1 WHERE id = 1", None),
        ("", None),
        ("   ", None),
        ("SAVEPOINTS", None),
        ("'unterminated", None),
    ],
)
def test_transaction_control(statement: str, kind: str | None) -> None:
    """The kind of a transaction-control statement, None for anything else."""
    assert transaction_control(statement) == kind


def test_only_a_lone_statement_is_transaction_control() -> None:
    """``BEGIN; UPDATE ...`` is two statements (the extractor counts it ``multi_statement``), not a BEGIN."""
    assert transaction_control("BEGIN; UPDATE orders SET a = 1 WHERE id = 1") is None
    assert transaction_control("COMMIT; ") == COMMIT
