"""The merge-request gate of a proof-of-fix: ``trace-repro gate --diff F --description F --contract F.json``.

An MR that claims to fix a production defect must let production prove it, so the gate checks that

1. the description says ``Proves #N`` and uses no closing keyword (``Closes``/``Fixes``/``Resolves``/``Implements``
   ``#N`` or an issue URL): the issue closes on the FIXED verdict, not on merge;
2. an added line outside the tests emits the contract's must-start event (its name appears in it);
3. an added line in a test file mentions the event inside an assertion (on that line or in the assertion that
   starts at most five added lines above);
4. no removed line that reports the defect (raises, throws or logs one of the contract's ``reports`` exception
   types, or defines it) is left without an equivalent added line (the same line moved, or another line of that
   file reporting it), and no added ``except <it>:`` just swallows it (``pass``/``return``/``continue``/``...``).

``check`` is pure; ``main`` reads the files and exits 0 (pass), 1 (fail) or 2 (unusable input).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from processors.contracts import ErrorSignature, ProofContract, parse_signature, short_exception

PROVES = re.compile(r"\bproves\s+#(\d+)\b", re.IGNORECASE)
CLOSING = re.compile(
    r"\b(?:clos(?:e|es|ed|ing)|fix(?:es|ed|ing)?|resolv(?:e|es|ed|ing)|implement(?:s|ed|ing)?)\b:?\s+"
    r"(?:[\w.\-/]*#\d+|https?://\S+/(?:issues|-/issues)/\d+)",
    re.IGNORECASE,
)
ASSERTS = re.compile(r"\bassert\w*|\bexpect\s*\(|\.should\b|\bverify\s*\(")
REPORTS = re.compile(
    r"\braise\b|\bthrow\b|\blog(?:ger|ging)?\s*\.|\.(?:error|exception|warning|critical|record_exception)\s*\("
)
SWALLOW = re.compile(r"^\s*(?:pass|return|continue|\.\.\.)\s*(?:#.*)?$")
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
LOOKBACK = 5


@dataclass(frozen=True, slots=True)
class GateResult:
    """The gate's decision: ``ok``, the failed checks (``reasons``) and the ones that held (``passed``)."""

    ok: bool
    reasons: tuple[str, ...]
    passed: tuple[str, ...] = ()
    proves: int | None = None


@dataclass(frozen=True, slots=True)
class DiffLine:
    path: str
    number: int  # line number in the new file (added) or the old file (removed)
    text: str


@dataclass(slots=True)
class Diff:
    added: list[DiffLine] = field(default_factory=list)
    removed: list[DiffLine] = field(default_factory=list)


def _path(header: str) -> str:
    name = header[4:].split("\t", 1)[0].strip()
    if name == "/dev/null":
        return ""
    return name[2:] if name.startswith(("a/", "b/")) else name


def parse_diff(text: str) -> Diff:
    """Added and removed lines of a unified diff (``git diff`` or ``diff -u``), with file and line number."""
    diff = Diff()
    old_path = new_path = ""
    old_left = new_left = 0
    old_no = new_no = 0
    for line in text.splitlines():
        if line.startswith("diff --git "):
            old_left = new_left = 0  # a new file ends any hunk, even one whose counts were wrong
            old_path = new_path = ""
            continue
        if old_left > 0 or new_left > 0:
            tag, body = line[:1], line[1:]
            if tag == "+":
                diff.added.append(DiffLine(new_path or old_path, new_no, body))
                new_no += 1
                new_left -= 1
            elif tag == "-":
                diff.removed.append(DiffLine(old_path or new_path, old_no, body))
                old_no += 1
                old_left -= 1
            elif tag == "\\":
                continue  # "\ No newline at end of file"
            else:
                old_no, new_no, old_left, new_left = old_no + 1, new_no + 1, old_left - 1, new_left - 1
            continue
        if line.startswith("--- "):
            old_path = _path(line)
        elif line.startswith("+++ "):
            new_path = _path(line)
        elif m := HUNK.match(line):
            old_no, new_no = int(m[1]), int(m[3])
            old_left = int(m[2]) if m[2] is not None else 1
            new_left = int(m[4]) if m[4] is not None else 1
    return diff


def is_test_path(path: str) -> bool:
    """Test files by the usual conventions: a tests/test/spec directory, test_*.py, *_test.*, *.test.*, *Test.*"""
    parts = path.split("/")
    name = parts[-1]
    return (
        any(p in ("tests", "test", "spec", "__tests__") for p in parts[:-1])
        or name.startswith("test_")
        or bool(re.search(r"(?:_test|\.test|\.spec|Test|Tests)\.\w+$", name))
    )


def _mentions(name: str, text: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", text) is not None


def _normal(text: str) -> str:
    return " ".join(text.split())


def _description(description: str, failed: list[str], passed: list[str]) -> int | None:
    proves = PROVES.search(description)
    closing = [m[0] for m in CLOSING.finditer(description)]
    if proves is None:
        failed.append('the description must say "Proves #<issue>" (the issue closes on the FIXED verdict)')
    else:
        passed.append(f"the description says {proves[0]!r}")
    if closing:
        failed.append(f"closing keyword(s) in the description would close the issue on merge: {closing}")
    else:
        passed.append("no closing keyword in the description")
    return int(proves[1]) if proves else None


def _emits(diff: Diff, event: str, failed: list[str], passed: list[str]) -> None:
    emitted = [a for a in diff.added if not is_test_path(a.path) and _mentions(event, a.text)]
    if emitted:
        passed.append(f"emits {event!r} at {emitted[0].path}:{emitted[0].number}")
    else:
        failed.append(f"no added line outside the tests emits the must-start event {event!r}")
    by_file: dict[str, dict[int, str]] = {}
    for a in diff.added:
        if is_test_path(a.path):
            by_file.setdefault(a.path, {})[a.number] = a.text
    for path, lines in sorted(by_file.items()):
        for number, text in sorted(lines.items()):
            if not _mentions(event, text):
                continue
            window = [lines.get(number - k, "") for k in range(LOOKBACK + 1)]
            contiguous: list[str] = []
            for w in window:
                if w == "" and contiguous:
                    break
                contiguous.append(w)
            if any(ASSERTS.search(w) for w in contiguous):
                passed.append(f"a test asserts {event!r} at {path}:{number}")
                return
    failed.append(f"no added test line asserts the must-start event {event!r}")


def _reported_names(contract: ProofContract) -> list[str]:
    names = {short_exception(r) for r in contract.reports if r}
    try:
        sig = parse_signature(contract.signature)
    except ValueError:
        sig = None
    if isinstance(sig, ErrorSignature) and not sig.error.startswith("HTTP ") and sig.error != "error":
        names.add(short_exception(sig.error))
    return sorted(names)


def _reporting(name: str, text: str) -> bool:
    if not _mentions(name, text):
        return False
    return REPORTS.search(text) is not None or re.match(rf"\s*class\s+{re.escape(name)}\b", text) is not None


def _keeps_reporting(diff: Diff, names: Sequence[str], failed: list[str], passed: list[str]) -> None:
    if not names:
        passed.append("the contract names no reporting code to protect")
        return
    added_norm = {_normal(a.text) for a in diff.added if not is_test_path(a.path)}
    for name in names:
        gone = []
        for r in diff.removed:
            if is_test_path(r.path) or not _reporting(name, r.text):
                continue
            if _normal(r.text) in added_norm:
                continue  # moved, not removed
            if any(a.path == r.path and _reporting(name, a.text) for a in diff.added):
                continue  # reported differently in the same file
            gone.append(r)
        swallowed = [
            a
            for i, a in enumerate(diff.added)
            if not is_test_path(a.path)
            and re.match(rf"\s*except\b.*\b{re.escape(name)}\b", a.text)
            and i + 1 < len(diff.added)
            and diff.added[i + 1].path == a.path
            and diff.added[i + 1].number == a.number + 1
            and SWALLOW.match(diff.added[i + 1].text)
        ]
        for r in gone:
            failed.append(f"removes the code that reports {name}: {r.path}:{r.number}: {r.text.strip()}")
        for a in swallowed:
            failed.append(f"swallows {name}: {a.path}:{a.number}: {a.text.strip()}")
        if not gone and not swallowed:
            passed.append(f"the code that reports {name} stays")


def check(diff_text: str, description: str, contract: ProofContract) -> GateResult:
    """Whether an MR may go in as the proof-of-fix of ``contract``; see the module docstring."""
    failed: list[str] = []
    passed: list[str] = []
    proves = _description(description, failed, passed)
    diff = parse_diff(diff_text)
    if not diff.added and not diff.removed:
        failed.append("the diff changes no line")
    _emits(diff, contract.must_start, failed, passed)
    _keeps_reporting(diff, _reported_names(contract), failed, passed)
    return GateResult(not failed, tuple(failed), tuple(passed), proves)


# ---- command line --------------------------------------------------------------------------------------------


def _read(path: str) -> str:
    return sys.stdin.read() if path == "-" else Path(path).read_text()


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Mount ``gate`` on a ``trace-repro`` sub-parser set; the parsed args carry ``handler``."""
    p = sub.add_parser("gate", help="check a proof-of-fix merge request against its contract")
    _arguments(p)
    p.set_defaults(handler=run)
    return p


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--diff", required=True, help="unified diff of the MR ('-' = stdin)")
    p.add_argument("--description", required=True, help="file with the MR description")
    p.add_argument("--contract", required=True, help="the proof contract (JSON, as published)")


def run(args: argparse.Namespace) -> int:
    """Run the gate on parsed arguments; print the reasons; 0 pass, 1 fail, 2 unusable input."""
    try:
        diff, description = _read(args.diff), _read(args.description)
        contract = ProofContract.model_validate_json(_read(args.contract))
    except (OSError, ValidationError) as exc:
        print(f"trace-repro gate: {exc}", file=sys.stderr)
        return 2
    result = check(diff, description, contract)
    print(f"gate {'PASSED' if result.ok else 'FAILED'} for {contract.signature} (must start {contract.must_start!r})")
    for line in result.passed:
        print(f"  ok    {line}")
    for line in result.reasons:
        print(f"  FAIL  {line}")
    return 0 if result.ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``trace-repro gate`` on its own."""
    p = argparse.ArgumentParser(prog="trace-repro gate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    _arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
