"""Going off call: allowed while another doctor of the shift stays on call.

The check counts the doctors on call, unlocked; two doctors going off call at once both count two, both go off
call, and nobody is on call any more: write skew (G2-item).
"""

from __future__ import annotations

from typing import Any

import psycopg


class NobodyOnCall(Exception):
    """The doctor is the last one on call for the shift."""


def go_off_call(conn: psycopg.Connection[Any], shift: int, name: str) -> dict[str, Any]:
    with conn.transaction(), conn.cursor() as cur:
        row = cur.execute("SELECT count(*) FROM doctors WHERE shift = %s AND on_call", (shift,)).fetchone()
        if row is None or row[0] < 2:
            raise NobodyOnCall(f"{name} is the last doctor on call for shift {shift}")
        cur.execute("UPDATE doctors SET on_call = false WHERE name = %s", (name,))
    return {"name": name, "on_call": False}
