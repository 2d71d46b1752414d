"""Transfers between accounts, and an audit that reads two balances.

The audit reads each balance with its own statement; a transfer committing between the two reads leaves it with
one balance from before and one from after: read skew (G-single), and the books do not balance.
"""

from __future__ import annotations

from typing import Any

import psycopg

READ_BALANCE = "SELECT balance FROM ledger WHERE acct = %s"


class BooksDoNotBalance(Exception):
    """The balances read do not add up to the total."""


def transfer(conn: psycopg.Connection[Any], source: str, target: str, amount: int) -> None:
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("UPDATE ledger SET balance = balance - %s WHERE acct = %s", (amount, source))
        cur.execute("UPDATE ledger SET balance = balance + %s WHERE acct = %s", (amount, target))


def audit(conn: psycopg.Connection[Any], first: str, second: str, total: int) -> int:
    with conn.transaction(), conn.cursor() as cur:
        (a,) = cur.execute(READ_BALANCE, (first,)).fetchone() or (0,)
        (b,) = cur.execute(READ_BALANCE, (second,)).fetchone() or (0,)
    if a + b != total:
        raise BooksDoNotBalance(f"{first} + {second} = {a + b}, not {total}")
    return a + b
