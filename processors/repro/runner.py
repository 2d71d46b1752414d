"""Runs a generated repro in a subprocess (``python -m pytest``) and reads back its verdict and its statements.

The subprocess gets an empty pytest configuration and an environment built from an allow-list, so that nothing of
the calling project or the daemon leaks in (a token of a sink, the daemon's own settings): ``PATH``, ``HOME``, the
locale (``LANG``, ``LANGUAGE``, ``LC_*``, ``TZ``) and the temporary directory (``TMPDIR``, ``TEMP``, ``TMP``) of the
daemon's environment, and what the run is given: ``REPRO_DSN``, ``REPRO_TRACE_OUT``, ``REPRO_STATEMENT_TIMEOUT_MS``
(and ``REPRO_SOURCE_ROOT`` for an application-level repro), and ``REPRO_SCRATCH_NAME`` (its database and role). No
``PYTHONPATH``: the interpreter's own site-packages hold pytest and psycopg, and the service's code is found through
``REPRO_SOURCE_ROOT``. No libpq ``PG*`` variable either: ``REPRO_DSN`` names the server completely (or with a
``~/.pgpass`` under ``HOME``). The test replays the recorded statements as an unprivileged role of its own, with that
statement timeout (``template_database``).
``failed`` means the test's own verdict (``DefectReproduced``: RED); any other failure or error of the test is
``error``.

The run's scratch database and role are named here (``repro_<fingerprint>_<unix s>_<random>``) and dropped here
whatever ends the run: the test drops them itself when it ends, but a test killed at its timeout, or whose parent
died, cannot. :func:`drop_scratch` ends their sessions first (``pg_terminate_backend``), then drops the database
(``WITH (FORCE)`` on PostgreSQL 13 and later) and the role, within bounded timeouts; :func:`sweep_scratch` drops the
leftovers of that naming scheme older than a run can last (a daemon killed mid-run), and the repro worker runs it
before its first repro.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Final

import psycopg
import structlog
from psycopg import sql

from processors.model.outputs import RunInfo
from processors.repro.divergence import ExecutedStatement, load_trace
from processors.repro.limits import STATEMENT_TIMEOUT_MS

if TYPE_CHECKING:
    from processors.repro.compiler import GeneratedTest

TIMEOUT_S = 180.0
VERDICT = "DefectReproduced"
PASSED = frozenset({"PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP"})  # from the daemon's env
PASSED_PREFIXES = ("LC_",)
# A run's database and role (the generated test's own default, ``template_database.scratch_name``, follows it too).
SCRATCH: Final = re.compile(r"repro_[a-z0-9]{1,16}_(\d{9,11})_[0-9a-f]{6}")
SWEEP_MARGIN_S = 60.0  # a leftover is swept once it is this much older than the longest run (clocks may differ)
CLEANUP_TIMEOUT_S = 10  # connecting, ending the sessions and each DROP, in seconds
_SESSIONS_OF = ("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE (usename = %s OR datname = %s) AND pid <> pg_backend_pid()")  # fmt: skip
_SCRATCH_LIKE = ("SELECT datname FROM pg_database WHERE datname LIKE 'repro\\_%' "
                 "UNION SELECT rolname FROM pg_roles WHERE rolname LIKE 'repro\\_%'")  # fmt: skip
log = structlog.get_logger("trace_repro.repro")


def _verdict(junit: Path, output: str) -> tuple[str, str]:
    """(status, failure text) from pytest's JUnit XML (written by our own subprocess)."""
    if not junit.exists():
        return "error", output[-4000:] or "pytest wrote no report"
    root = ET.parse(junit).getroot()  # noqa: S314 - our own subprocess's report, no DTD, no entities
    cases = list(root.iter("testcase"))
    if not cases:
        return "error", output[-4000:] or "no test was collected"
    for case in cases:
        for tag in ("failure", "error"):
            found = case.find(tag)
            if found is not None:
                message = found.get("message", "")
                text = (found.text or "").strip()
                if tag == "failure" and VERDICT in message:
                    return "failed", _whole(message, text)
                return "error", message or text[-4000:]
        if case.find("skipped") is not None:
            return "error", "the test was skipped"
    return "passed", ""


def _whole(message: str, text: str) -> str:
    """The verdict as raised: pytest shortens a long message attribute (``[... full report in element text]``), the
    report's ``E`` lines hold all of it."""
    if "full report in element text]" not in message:
        return message
    lines = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    first = next((i for i, line in enumerate(lines) if VERDICT in line), None)
    return "\n".join(lines[first:]) if first is not None else message


def scratch_name(fingerprint: str, now_s: float | None = None) -> str:
    """A new name for a run's database and role: ``repro_<fingerprint>_<unix s>_<random>`` (:data:`SCRATCH`)."""
    tag = "".join(c for c in fingerprint.lower() if c.isascii() and c.isalnum())[:16] or "incident"
    return f"repro_{tag}_{int(time.time() if now_s is None else now_s)}_{secrets.token_hex(3)}"


def drop_scratch(dsn: str, names: Iterable[str]) -> bool:
    """End the sessions of each named run's role and database, drop the database and then the role, each step
    bounded by :data:`CLEANUP_TIMEOUT_S`; False (logged, left for :func:`sweep_scratch`) when the server refused or
    could not be reached."""
    names = list(names)
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=CLEANUP_TIMEOUT_S) as admin:
            for setting in ("statement_timeout", "lock_timeout"):
                admin.execute(sql.SQL("SET {} = {}").format(sql.Identifier(setting),
                                                           sql.Literal(f"{CLEANUP_TIMEOUT_S}s")))  # fmt: skip
            force = sql.SQL(" WITH (FORCE)" if admin.info.server_version >= 130000 else "")
            for name in names:
                with contextlib.suppress(psycopg.errors.InsufficientPrivilege):  # then FORCE ends them, if it may
                    admin.execute(_SESSIONS_OF, (name, name))
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {}{}").format(sql.Identifier(name), force))
                admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))
    except (psycopg.Error, OSError) as exc:
        log.warning("repro.scratch_left", names=names, error=type(exc).__name__, detail=str(exc)[:200])
        return False
    return True


def sweep_scratch(dsn: str, *, older_than_s: float = TIMEOUT_S + SWEEP_MARGIN_S, now_s: float | None = None
                  ) -> list[str]:  # fmt: skip
    """Drop the databases and roles of :data:`SCRATCH`'s scheme created more than ``older_than_s`` ago (a run
    killed with its parent); returns their names (none when the server cannot be reached: logged)."""
    cutoff = (time.time() if now_s is None else now_s) - older_than_s
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=CLEANUP_TIMEOUT_S) as admin:
            found = admin.execute(_SCRATCH_LIKE).fetchall()
    except (psycopg.Error, OSError) as exc:
        log.warning("repro.sweep_failed", error=type(exc).__name__, detail=str(exc)[:200])
        return []
    old = sorted(name for (name,) in found if (m := SCRATCH.fullmatch(name)) and int(m.group(1)) < cutoff)
    if old and drop_scratch(dsn, old):
        log.info("repro.scratch_swept", names=old)
        return old
    return []


@contextmanager
def scratch(dsn: str, fingerprint: str) -> Iterator[str]:
    """A new scratch name for one run, dropped (with :func:`drop_scratch`) however the block ends."""
    name = scratch_name(fingerprint)
    try:
        yield name
    finally:
        drop_scratch(dsn, [name])


def environment(*, dsn: str, trace: Path, statement_timeout_ms: int, source_root: str | None,
                scratch: str | None = None, daemon: Mapping[str, str] | None = None) -> dict[str, str]:  # fmt: skip
    """The whole environment of a repro subprocess: the allow-listed variables of ``daemon`` (default
    ``os.environ``) and the run's own (see the module docstring)."""
    daemon = os.environ if daemon is None else daemon
    env = {k: v for k, v in daemon.items() if k in PASSED or k.startswith(PASSED_PREFIXES)}
    env.update({
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # the test needs no plugin; loading them doubles its run time
        "PYTHONDONTWRITEBYTECODE": "1",
        "REPRO_DSN": dsn,
        "REPRO_TRACE_OUT": str(trace),
        "REPRO_STATEMENT_TIMEOUT_MS": str(int(statement_timeout_ms)),
    })  # fmt: skip
    if source_root:
        env["REPRO_SOURCE_ROOT"] = source_root
    if scratch:
        env["REPRO_SCRATCH_NAME"] = scratch
    return env


def run_repro(test: GeneratedTest, *, dsn: str, workdir: Path, source_root: str | None = None, label: str = "run",
              statement_timeout_ms: int = STATEMENT_TIMEOUT_MS) -> tuple[RunInfo, list[ExecutedStatement]]:  # fmt: skip
    """Run ``test`` once against ``dsn``; returns the run and the statements it executed, in order.

    ``dsn`` only creates and drops the run's role and scratch database; the recorded statements run as that role,
    each ended after ``statement_timeout_ms`` (the run is then an ``error`` that names the statement). The role and
    database are dropped here too, whatever ended the run (its timeout, an exception, an interrupt).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / test.name
    path.write_text(test.source, encoding="utf-8")
    junit = workdir / f"junit-{label}.xml"
    trace = workdir / f"trace-{label}.json"
    for stale in (junit, trace):
        stale.unlink(missing_ok=True)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull,
               "--rootdir", str(workdir), str(path), f"--junitxml={junit}"]  # fmt: skip
    started = time.monotonic()
    with scratch(dsn, test.fingerprint) as name:
        env = environment(dsn=dsn, trace=trace, statement_timeout_ms=statement_timeout_ms,
                          source_root=source_root or test.source_root, scratch=name)  # fmt: skip
        try:
            done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
                                  check=False)  # fmt: skip
            output = done.stdout + done.stderr
            status, failure = _verdict(junit, output)
        except subprocess.TimeoutExpired as exc:
            status, failure = "error", f"timed out after {exc.timeout:.0f} s"
    duration = (time.monotonic() - started) * 1000
    return RunInfo(status=status, failure=failure, duration_ms=round(duration, 1)), load_trace(trace)
