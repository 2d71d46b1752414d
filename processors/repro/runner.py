"""Runs a generated repro in a subprocess (``python -m pytest``) and reads back its verdict and its statements.

The subprocess gets ``REPRO_DSN``, ``REPRO_TRACE_OUT`` (and ``REPRO_SOURCE_ROOT`` for an application-level repro)
and an empty pytest configuration, so that nothing of the calling project leaks in. ``failed`` means the test's
own verdict (``DefectReproduced``: RED); any other failure or error of the test is ``error``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from processors.repro.compiler import GeneratedTest
from processors.repro.divergence import ExecutedStatement, load_trace
from streamer.schemas import RunInfo

TIMEOUT_S = 180.0
VERDICT = "DefectReproduced"


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
                    return "failed", message
                return "error", message or text[-4000:]
        if case.find("skipped") is not None:
            return "error", "the test was skipped"
    return "passed", ""


def run_repro(test: GeneratedTest, *, dsn: str, workdir: Path, source_root: str | None = None,
              label: str = "run") -> tuple[RunInfo, list[ExecutedStatement]]:  # fmt: skip
    """Run ``test`` once against ``dsn``; returns the run and the statements it executed, in order."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / test.name
    path.write_text(test.source, encoding="utf-8")
    junit = workdir / f"junit-{label}.xml"
    trace = workdir / f"trace-{label}.json"
    for stale in (junit, trace):
        stale.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "REPRO_"))}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # the test needs no plugin; loading them doubles its run time
    env.pop("PYTHONPATH", None)
    env.update({"REPRO_DSN": dsn, "REPRO_TRACE_OUT": str(trace), "PYTHONDONTWRITEBYTECODE": "1"})
    root = source_root or test.source_root
    if root:
        env["REPRO_SOURCE_ROOT"] = root
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
