"""Repro files for CI: the generated test, a JUnit XML of its runs, and a GitLab Code Quality report.

Written to ``<out>/repros/<fingerprint>/`` (a fingerprint that is not a plain name is hashed, and every path is resolved
under ``out``: :func:`processors.repro.paths.under` refuses one that would leave it). The JUnit XML has one testcase per
run (``red``, ``green``), a RED run a failure, text stripped of characters XML cannot hold. The Code Quality report
lists the incident's unprotected writers (no lock, no guard) at the line of their statement when the source is readable
(the ``execute`` call whose statically known text matches the recorded statement, in the function or else in its
module), else at the function's ``def``.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from processors.model.anomaly import Anomaly
from processors.model.outputs import AccessInfo, IncidentEvent, RunInfo
from processors.repro.compiler import GeneratedTest, safe_name
from processors.repro.paths import under
from processors.repro.statements import normalise

CODE_QUALITY = "gl-code-quality-report.json"
JUNIT = "junit.xml"
_XML_UNSAFE = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_MAX_SOURCE = 2_000_000


@dataclass(frozen=True, slots=True)
class ReproFiles:
    """Where the files of one repro were written."""

    directory: Path
    test: Path
    junit: Path
    code_quality: Path


def _xml_text(text: str) -> str:
    return _XML_UNSAFE.sub("\ufffd", text)


def junit_xml(test: GeneratedTest, runs: Mapping[str, RunInfo]) -> str:
    """One testcase per run (``red``, ``green``, ...): a RED run is a failure, as pytest reported it."""
    suite = ET.Element("testsuite", name=f"trace-repro.{safe_name(test.fingerprint)}", tests=str(len(runs)),
                       failures=str(sum(r.status == "failed" for r in runs.values())),
                       errors=str(sum(r.status == "error" for r in runs.values())),
                       time=f"{sum(r.duration_ms for r in runs.values()) / 1000:.3f}")  # fmt: skip
    for label, run in runs.items():
        case = ET.SubElement(suite, "testcase", classname=f"repro.{test.anomaly}.{test.level}",
                             name=_xml_text(label), time=f"{run.duration_ms / 1000:.3f}")  # fmt: skip
        if run.status in ("failed", "error"):
            tag = "failure" if run.status == "failed" else "error"
            node = ET.SubElement(case, tag, message=_xml_text(run.failure.splitlines()[0] if run.failure else ""))
            node.text = _xml_text(run.failure)
    root = ET.Element("testsuites")
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _parts(node: ast.expr, constants: Mapping[str, str]) -> list[str | None]:
    """The statically known pieces of a statement expression (None: unknown at this point)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name) and node.id in constants:
        return [constants[node.id]]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _parts(node.left, constants) + _parts(node.right, constants)
    return [None]


def _matches(parts: list[str | None], statement: str) -> bool:
    known = [normalise(p) for p in parts if p]
    if not known or parts[0] is None or not statement.startswith(known[0]):
        return False
    at = 0
    for piece in known:
        at = statement.find(piece, at)
        if at < 0:
            return False
        at += len(piece)
    return True


def locate(file: str, function: str, statement: str) -> int:
    """The line of ``function``'s statement in ``file`` (its ``def`` if not found; 1 if unreadable)."""
    path = Path(file)
    try:
        if not path.is_file() or path.stat().st_size > _MAX_SOURCE:
            return 1
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return 1
    constants = {
        t.id: n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    name = function.rsplit(".", 1)[-1]
    defs = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name]
    if not defs:
        return 1
    target = normalise(statement)
    for scope in (defs[0], tree):  # the function itself, then a helper of the same module
        for node in ast.walk(scope):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            execute = isinstance(node.func, ast.Attribute) and node.func.attr == "execute"
            if execute and _matches(_parts(node.args[0], constants), target):
                return node.lineno
    return defs[0].lineno


def _relative(file: str, repo_root: Path | None) -> str:
    if repo_root is not None:
        try:
            return Path(file).resolve().relative_to(repo_root.resolve()).as_posix()
        except ValueError:
            pass
    return file


def code_quality(incident: IncidentEvent, repo_root: Path | None = None) -> list[dict[str, Any]]:
    """GitLab Code Quality issues: one per unprotected writer (function and statement) of the incident; for a read
    skew, one per unlocked read of the reader (the writer's transaction did nothing wrong)."""
    seen: dict[tuple[str, str, str], AccessInfo] = {}
    reader = incident.anomaly == Anomaly.READ_SKEW
    flagged = (
        [a for a in incident.accesses if a.trace_id == incident.victim.trace_id and a.operation == "read"]
        if reader
        else incident.writers
    )
    for w in flagged:
        if w.lock == "none":
            seen.setdefault((w.function, w.file, w.statement), w)
    issues = []
    for (function, file, statement), w in seen.items():
        identity = "\n".join([incident.fingerprint, function, file, statement]).encode("utf-8", "surrogatepass")
        digest = hashlib.sha256(identity).hexdigest()
        what = "reads it in separate statements, unlocked" if reader else "writes without a lock or guard"
        issues.append(
            {
                "description": f"{incident.anomaly} on {incident.table}: {function or w.service} {what}: {statement}",
                "check_name": f"trace-repro/{incident.anomaly}",
                "fingerprint": digest,
                "severity": "critical" if incident.manifest else "major",
                "location": {"path": _relative(file, repo_root), "lines": {"begin": locate(file, function, statement)}},
            }
        )
    return issues


def write_repro_files(out: Path, incident: IncidentEvent, test: GeneratedTest, runs: Mapping[str, RunInfo], *,
                      repo_root: Path | None = None) -> ReproFiles:  # fmt: skip
    """Write the test, the JUnit XML of ``runs`` and the Code Quality report to ``out/repros/<fingerprint>/``;
    raises :class:`~processors.repro.paths.UnsafePath` (writing nothing) when a path would resolve outside ``out``."""
    directory = out / "repros" / safe_name(incident.fingerprint)
    test_path, junit, quality = (directory / name for name in (test.name, JUNIT, CODE_QUALITY))
    for path in (test_path, junit, quality):  # each checked (symlinks resolved) before anything is written
        under(out, *path.relative_to(out).parts)
    directory.mkdir(parents=True, exist_ok=True)
    test_path.write_text(test.source, encoding="utf-8")
    junit.write_text(junit_xml(test, runs), encoding="utf-8")
    quality.write_text(json.dumps(code_quality(incident, repo_root), indent=2) + "\n", encoding="utf-8")
    return ReproFiles(directory, test_path, junit, quality)
