"""A repro's evidence packet: what it was made from and with, as plain data a person (or a tool) can check.

The packet holds the Python that compiled and ran the repro and the versions of the packages that matter to it
(psycopg, pytest, the compiler's libcst and sqlglot, and the ORMs and drivers a repro may call, where installed),
the PostgreSQL server the repro ran RED on, trace-repro's own version, the settings that shaped it (detection's
window and skew, the table's invariants, the repro's timeout and reduction bounds: never a DSN or a secret), what
production's spans say (each trace's service and ``service.version``), the incident's accesses and row changes
exactly as recorded, and what the reduction removed. The compiler writes it into the generated file as one literal
(``EVIDENCE``, parsed back and compared: untrusted values stay data) and :func:`write_sidecar` beside it as JSON.

What the incident does not carry is said, not guessed: instrumentation scopes, ``telemetry.sdk.*`` and
``db.system`` (nor the production database's version) are not kept on incidents, so the production side names only
the services and their versions, and lists what it lacks.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import psycopg

from processors.model.outputs import IncidentEvent
from processors.repro.literals import plain
from processors.repro.paths import under
from processors.repro.schedule import Schedule

FORMAT = 1
SIDECAR = "evidence.json"
# The packages a generated repro (or what it calls) depends on; those installed are listed with their version.
PACKAGES = ("psycopg", "psycopg-binary", "psycopg-c", "pytest", "libcst", "sqlglot", "psycopg2", "psycopg2-binary",
            "asyncpg", "SQLAlchemy", "Django")  # fmt: skip
NOT_ON_INCIDENTS = ("db.system", "the database server's version", "telemetry.sdk.*", "instrumentation scopes")
CONNECT_TIMEOUT_S = 10


def _version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """The Python, packages and trace-repro version the repro is compiled and run with (it runs in this
    interpreter: :mod:`processors.repro.runner`)."""
    packages = {name: found for name in PACKAGES if (found := _version(name)) is not None}
    return {
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation()},
        "packages": packages,
        "trace_repro": _version("trace-repro") or "0+unknown",
    }


def server_version(dsn: str) -> str | None:
    """The PostgreSQL server's ``server_version`` at ``dsn`` (where the repro runs); None when it cannot be asked."""
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S) as conn:
            row = conn.execute("SHOW server_version").fetchone()
    except (psycopg.Error, OSError):
        return None
    return str(row[0]) if row else None


def production(incident: IncidentEvent) -> dict[str, Any]:
    """What the spans say of production: each trace's service and ``service.version``; and what they do not."""
    traces: dict[str, dict[str, str]] = {}
    for a in incident.accesses:
        traces.setdefault(a.trace_id, {"trace_id": a.trace_id, "service": a.service, "version": a.version})
    return {"traces": list(traces.values()), "not_on_incidents": list(NOT_ON_INCIDENTS)}


def recorded(incident: IncidentEvent) -> dict[str, Any]:
    """The incident's accesses and row changes, exactly as recorded (JSON data)."""
    return {
        "fingerprint": incident.fingerprint,
        "occurrence": incident.occurrence,
        "anomaly": incident.anomaly,
        "entity": incident.entity,
        "table": incident.table,
        "accesses": [a.model_dump(mode="json") for a in incident.accesses],
        "commits": [c.model_dump(mode="json") for c in incident.commits],
    }


def reduction_record(schedule: Schedule, *, enabled: bool, removed_steps: Sequence[int] = (),
                     removed_rows: Sequence[int] = (), fixed: Sequence[int] = (), runs: int = 0, stopped_by: str = "",
                     shipped: str = "full", why: str = "", bounds: Mapping[str, Any] | None = None,
                     full_test: str = "") -> dict[str, Any]:  # fmt: skip
    """What the reduction did to the full ``schedule``: the steps and seed rows it removed (as recorded), the steps
    it could not remove, the candidates it ran, the bound that stopped it, and which repro is shipped."""
    gone = set(removed_steps)
    steps = [{"session": s.session, "kind": s.kind, "statement": s.statement, "params": s.params}
             for s in schedule.steps if s.index in gone]  # fmt: skip
    return {
        "enabled": enabled,
        "shipped": shipped,
        "why": why,
        "steps": {"full": len(schedule.steps), "kept": len(schedule.steps) - len(gone)},
        "rows": {"full": len(schedule.seed), "kept": len(schedule.seed) - len(set(removed_rows))},
        "removed_steps": steps,
        "removed_rows": [schedule.seed[j] for j in sorted(set(removed_rows))],
        "fixed_steps": sorted(fixed),
        "runs": runs,
        "stopped_by": stopped_by,
        "bounds": dict(bounds or {}),
        "full_test": full_test,
    }


def packet(incident: IncidentEvent, *, level: str, settings: Mapping[str, Any], server: str | None,
           reduction: Mapping[str, Any]) -> dict[str, Any]:  # fmt: skip
    """The evidence packet of ``incident``'s repro (plain data; see the module docstring)."""
    env = environment()
    data: dict[str, Any] = plain(
        {
            "format": FORMAT,
            "level": level,
            **env,
            "postgresql": {"repro_server": server, "production": None},
            "production": production(incident),
            "settings": dict(settings),
            "recorded": recorded(incident),
            "reduction": dict(reduction),
        }
    )
    return data


def summary(evidence: Mapping[str, Any]) -> dict[str, Any]:
    """The packet without the recorded statements and images (what a published event and an issue show)."""
    return {k: v for k, v in evidence.items() if k != "recorded"}


def write_sidecar(out: Path, directory: Path, evidence: Mapping[str, Any], full_source: str | None = None,
                  full_name: str = "") -> Path:  # fmt: skip
    """``evidence.json`` (and the full repro ``full_name``, when the shipped one is reduced) in ``directory``, a
    directory under ``out``: each path resolved under ``out`` first (:func:`~processors.repro.paths.under`)."""
    relative = directory.relative_to(out).parts
    sidecar = under(out, *relative, SIDECAR)
    full = under(out, *relative, full_name) if full_source is not None and full_name else None
    sidecar.parent.mkdir(parents=True, exist_ok=True)
    sidecar.write_text(json.dumps(evidence, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    if full is not None and full_source is not None:
        full.write_text(full_source, encoding="utf-8")
    return sidecar


__all__ = ["SIDECAR", "environment", "packet", "production", "recorded", "reduction_record", "server_version",
           "summary", "write_sidecar"]  # fmt: skip
