"""Runs a generated repro in a subprocess (``python -m pytest``) and reads back its verdict and its statements.

The subprocess gets an empty pytest configuration and an environment built from an allow-list, so that nothing of
the calling project or the daemon leaks in (a token of a sink, the daemon's own settings): ``PATH``, ``HOME``, the
locale (``LANG``, ``LANGUAGE``, ``LC_*``, ``TZ``) and the temporary directory (``TMPDIR``, ``TEMP``, ``TMP``) of the
daemon's environment, and what the run is given: ``REPRO_DSN``, ``REPRO_TRACE_OUT``, ``REPRO_STATEMENT_TIMEOUT_MS``
(and ``REPRO_SOURCE_ROOT`` for an application-level repro). No ``PYTHONPATH``: the interpreter's own site-packages
hold pytest and psycopg, and the service's code is found through ``REPRO_SOURCE_ROOT``. No libpq ``PG*`` variable
either: ``REPRO_DSN`` names the server completely (or with a ``~/.pgpass`` under ``HOME``). The test replays the
recorded statements as an unprivileged role of its own, with that statement timeout (``template_database``).
``failed`` means the test's own verdict (``DefectReproduced``: RED); any other failure or error of the test is
``error``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from processors.model.outputs import RunInfo
from processors.repro.divergence import ExecutedStatement, load_trace
from processors.repro.limits import STATEMENT_TIMEOUT_MS

if TYPE_CHECKING:
    from processors.repro.compiler import GeneratedTest

TIMEOUT_S = 180.0
VERDICT = "DefectReproduced"
PASSED = frozenset({"PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TEMP", "TMP"})  # from the daemon's env
PASSED_PREFIXES = ("LC_",)


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


def environment(*, dsn: str, trace: Path, statement_timeout_ms: int, source_root: str | None,
                daemon: Mapping[str, str] | None = None) -> dict[str, str]:  # fmt: skip
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
    return env


def run_repro(test: GeneratedTest, *, dsn: str, workdir: Path, source_root: str | None = None, label: str = "run",
              statement_timeout_ms: int = STATEMENT_TIMEOUT_MS) -> tuple[RunInfo, list[ExecutedStatement]]:  # fmt: skip
    """Run ``test`` once against ``dsn``; returns the run and the statements it executed, in order.

    ``dsn`` only creates and drops the run's role and scratch database; the recorded statements run as that role,
    each ended after ``statement_timeout_ms`` (the run is then an ``error`` that names the statement).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / test.name
    path.write_text(test.source, encoding="utf-8")
    junit = workdir / f"junit-{label}.xml"
    trace = workdir / f"trace-{label}.json"
    for stale in (junit, trace):
        stale.unlink(missing_ok=True)
    env = environment(dsn=dsn, trace=trace, statement_timeout_ms=statement_timeout_ms,
                      source_root=source_root or test.source_root)  # fmt: skip
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull,
               "--rootdir", str(workdir), str(path), f"--junitxml={junit}"]  # fmt: skip
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
                              check=False)  # fmt: skip
        output = done.stdout + done.stderr
        status, failure = _verdict(junit, output)
    except subprocess.TimeoutExpired as exc:
        status, failure = "error", f"timed out after {exc.timeout:.0f} s"
    duration = (time.monotonic() - started) * 1000
    return RunInfo(status=status, failure=failure, duration_ms=round(duration, 1)), load_trace(trace)
