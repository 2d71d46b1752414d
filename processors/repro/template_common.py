"""Template: the data and values every generated repro carries (inlined first by the compiler; stdlib only here).

The harness is three templates that the compiler inlines, in this order, into one module ahead of the level's
template (``template_sql`` or ``template_app``): this one (the recorded data, the run's settings, the errors, how
values are compared), ``template_database`` (the scratch database, the entity's table and seed rows, one session
per recorded trace) and ``template_driver`` (the driver that hands out the recorded steps, and the verdict). They
import each other's names only for the linters: the compiler drops those imports and merges the others. The data
block below is replaced by literals of the recorded incident.
"""

from __future__ import annotations

import os
from datetime import date, datetime, timedelta
from datetime import time as clock
from decimal import Decimal
from typing import Any

# ---- recorded in production (generated data) ------------------------------------------------------------------
FINGERPRINT: str = ""
ANOMALY: str = ""
ENTITY: str = ""
ENTITIES: list[str] = []
TABLE: str = ""
KEY: dict[str, Any] = {}
IDENTITY: bool = False
SCHEMA_SQL: str | None = None
MIGRATIONS: list[str] = []
COLUMNS: list[list[str]] = []
SEED: list[dict[str, Any]] = []
SESSIONS: dict[int, dict[str, Any]] = {}
STEPS: list[dict[str, Any]] = []
CHECK: dict[str, Any] = {}
# ---- end of recorded data -------------------------------------------------------------------------------------

DSN = os.environ.get("REPRO_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
TRACE_OUT = os.environ.get("REPRO_TRACE_OUT", "")
STEP_TIMEOUT_S = float(os.environ.get("REPRO_STEP_TIMEOUT_S", "30"))  # a safety net for a stuck schedule
# The longest a recorded statement (or its wait for a lock) may take on the scratch database: a recorded statement
# is untrusted, and the run ends with a HarnessError naming it when one takes longer.
STATEMENT_TIMEOUT_MS = int(os.environ.get("REPRO_STATEMENT_TIMEOUT_MS", "5000"))
POLL_S = 0.002  # how often a running statement is checked for a lock wait (a condition wait, not a pause)
TYPES = ("bigint", "text", "boolean", "double precision", "jsonb")


class HarnessError(RuntimeError):
    """The repro itself could not run (not the defect)."""


class DefectReproduced(AssertionError):
    """The production failure happened again."""


def norm(value: Any) -> Any:
    """A database or parameter value as plain JSON data."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, datetime | date | clock):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, list | tuple):
        return [norm(v) for v in value]
    if isinstance(value, dict):
        return {str(k): norm(v) for k, v in value.items()}
    return str(value)


def normalise(statement: str) -> str:
    return " ".join(statement.split()).rstrip(";").rstrip()


def who(number: int) -> str:
    info = SESSIONS.get(number, {})
    return f"session {number} ({info.get('function') or info.get('service') or '?'})"
