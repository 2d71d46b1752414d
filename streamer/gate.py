"""The merge-request gate of a proof-of-fix: ``trace-repro gate --diff F --description F --contract F.json``.

An MR that claims to fix a production defect must let production prove it, so the gate checks that

1. the description says ``Proves #N`` and uses no closing keyword (``Closes``/``Fixes``/``Resolves``/``Implements``
   ``#N`` or an issue URL), nor do the MR's commit messages (``--commits``: GitLab closes an issue a commit message
   names that way when the commit reaches the default branch): the issue closes on the FIXED verdict, not on merge;
2. an added line of code (a comment or a docstring that names the event does not count: :mod:`streamer.gate_code`)
   outside the tests (and outside the contract and CI job committed with the fix: ``.trace-repro/``,
   ``.gitlab/``, ``.gitlab-ci.yml``) emits the contract's must-start event (its name appears in it); a contract
   without one is refused (an empty name would match every line);
3. an added line in a test file mentions the event inside an assertion (on that line or in the assertion that
   starts at most five added lines above);
4. no removed line that reports the defect (raises, throws or logs one of the contract's ``reports`` exception
   types, or defines it) is left without an equivalent added line (the same line moved, or another line of that
   file reporting it), and no added ``except <it>:`` just swallows it (``pass``/``return``/``continue``/``...``);
5. the contract, when it names an issue, is the one of the issue the description proves;
6. with ``--junit`` (the JUnit XML of the MR's tests, as ``pytest --junitxml`` writes it): at least one test ran,
   none failed or errored, and the added test function that asserts the must-start event (or, when the assertion
   is in no added function, a test of its file) passed.

``check`` is pure; ``main`` reads the files and exits 0 (pass), 1 (fail) or 2 (unusable input). ``--codequality F``
also writes the failures as a GitLab Code Quality report (``[]`` when the gate passes), every location a path
relative to the repository (the diff's paths; the contract file's, as given, for failures of no diff line).

In a GitLab merge-request pipeline, ``config/gitlab-ci/trace-repro-gate.yml`` runs it: the contract is the file
committed with the MR (``.trace-repro/contracts/<N>.json``, written by ``trace-repro contract add --write``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from processors.connectors.proofs.contracts import ErrorSignature, parse_signature, short_exception
from processors.model.contract import ProofContract
from streamer.diffs import Diff, parse_diff
from streamer.gate_code import code_of, is_code, is_test_path, mentions

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
TEST_DEF = re.compile(r"^\s*(?:async\s+)?def\s+(test\w*)\s*\(")
SWALLOW = re.compile(r"^\s*(?:pass|return|continue|\.\.\.)\s*(?:#.*)?$")
LOOKBACK = 5


@dataclass(frozen=True, slots=True)
class Finding:
    """One failed check, with the diff line it is about when there is one (``path`` "" otherwise)."""

    text: str
    path: str = ""
    line: int = 0


@dataclass(frozen=True, slots=True)
class GateResult:
    """The gate's decision: ``ok``, the failed checks (``reasons``, located in ``findings``) and the ones that held."""

    ok: bool
    reasons: tuple[str, ...]
    passed: tuple[str, ...] = ()
    proves: int | None = None
    findings: tuple[Finding, ...] = ()


@dataclass(frozen=True, slots=True)
class TestRun:
    """What a JUnit XML report says: how many test cases, the (classname, name) of those that passed, the failures.

    pytest's classname is the test file's path, dotted, without ``.py`` (plus ``.Class`` for a method).
    """

    __test__ = False  # not a pytest class

    total: int
    passed: frozenset[tuple[str, str]]
    failures: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Asserting:
    """Where an added test line asserts the must-start event: the file, and the added test function around it."""

    path: str
    function: str | None


def _normal(text: str) -> str:
    return " ".join(text.split())


def _description(description: str, failed: list[Finding], passed: list[str]) -> int | None:
    proves = PROVES.search(description)
    closing = [m[0] for m in CLOSING.finditer(description)]
    if proves is None:
        failed.append(Finding('the description must say "Proves #<issue>" (the issue closes on the FIXED verdict)'))
    else:
        passed.append(f"the description says {proves[0]!r}")
    if closing:
        failed.append(Finding(f"closing keyword(s) in the description would close the issue on merge: {closing}"))
    else:
        passed.append("no closing keyword in the description")
    return int(proves[1]) if proves else None


def _commit_messages(commits: str, failed: list[Finding], passed: list[str]) -> None:
    """GitLab closes the issues a commit message names with a closing keyword when the commit reaches the default
    branch, whatever the description says: the MR's commit messages must not use one either."""
    closing = [m[0] for m in CLOSING.finditer(commits)]
    if closing:
        failed.append(Finding(f"closing keyword(s) in a commit message would close the issue on merge: {closing} "
                              "(reword the commit: say Proves #N)"))  # fmt: skip
    else:
        passed.append("no closing keyword in the commit messages")


def _emits(diff: Diff, event: str, failed: list[Finding], passed: list[str]) -> Asserting | None:
    """Check 2 and 3 (on the code of the added lines: a comment or a docstring naming the event does not count);
    where an added test asserts ``event`` (None: no added test does)."""
    code = code_of(diff.added)
    emitted = [a for a, text in code if is_code(a.path) and mentions(event, text)]
    if emitted:
        passed.append(f"emits {event!r} at {emitted[0].path}:{emitted[0].number}")
    else:
        named = [a for a in diff.added if is_code(a.path) and mentions(event, a.text)]
        where = f" (named only in a comment or docstring at {named[0].path}:{named[0].number})" if named else ""
        failed.append(Finding(f"no added line outside the tests emits the must-start event {event!r}{where}",
                              named[0].path if named else "", named[0].number if named else 0))  # fmt: skip
    by_file: dict[str, dict[int, str]] = {}
    for a, text in code:
        if is_test_path(a.path):
            by_file.setdefault(a.path, {})[a.number] = text
    for path, lines in sorted(by_file.items()):
        for number, text in sorted(lines.items()):
            if not mentions(event, text):
                continue
            window = [lines.get(number - k, "") for k in range(LOOKBACK + 1)]
            contiguous: list[str] = []
            for w in window:
                if w == "" and contiguous:
                    break
                contiguous.append(w)
            if any(ASSERTS.search(w) for w in contiguous):
                passed.append(f"a test asserts {event!r} at {path}:{number}")
                above = (TEST_DEF.match(lines[n]) for n in sorted(lines, reverse=True) if n <= number)
                function = next((m[1] for m in above if m), None)
                return Asserting(path, function)
    failed.append(Finding(f"no added test line asserts the must-start event {event!r}"))
    return None


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
    if not mentions(name, text):
        return False
    return REPORTS.search(text) is not None or re.match(rf"\s*class\s+{re.escape(name)}\b", text) is not None


def _keeps_reporting(diff: Diff, names: Sequence[str], failed: list[Finding], passed: list[str]) -> None:
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
            text = f"removes the code that reports {name}: {r.path}:{r.number}: {r.text.strip()}"
            failed.append(Finding(text, r.path, r.number))
        for a in swallowed:
            failed.append(Finding(f"swallows {name}: {a.path}:{a.number}: {a.text.strip()}", a.path, a.number))
        if not gone and not swallowed:
            passed.append(f"the code that reports {name} stays")


def _module(path: str) -> str:
    """``tests/test_split.py`` -> ``tests.test_split``: how pytest's JUnit XML names the classes of a test file."""
    return path.removesuffix(".py").replace("/", ".")


def _tests_ran(run: TestRun, asserting: Asserting | None, failed: list[Finding], passed: list[str]) -> None:
    if run.total == 0:
        failed.append(Finding("no test ran: the JUnit report holds no test case"))
        return
    for failure in run.failures:
        failed.append(Finding(f"a test failed: {failure}"))
    if not run.failures:
        passed.append(f"{run.total} test(s) ran, none failed")
    if asserting is None:
        return
    module = _module(asserting.path)
    # The added test function around the assertion (its parametrised cases too), else any test of its file.
    name = asserting.function
    ran = [
        (cls, case)
        for cls, case in run.passed
        if (cls == module or cls.startswith(module + "."))
        and (name is None or case == name or case.startswith(name + "["))
    ]
    where = f"{asserting.path}::{name}" if name else asserting.path
    if ran:
        passed.append(f"the test that asserts the must-start event passed ({where})")
    else:
        failed.append(Finding(f"the test that asserts the must-start event did not pass in this run: {where}",
                              asserting.path, 1))  # fmt: skip


def check(diff_text: str, description: str, contract: ProofContract, run: TestRun | None = None,
          commits: str | None = None) -> GateResult:  # fmt: skip
    """Whether an MR may go in as the proof-of-fix of ``contract``; see the module docstring. ``commits`` is the
    text of the MR's commit messages (None: not given, not checked)."""
    failed: list[Finding] = []
    passed: list[str] = []
    proves = _description(description, failed, passed)
    if commits is not None:
        _commit_messages(commits, failed, passed)
    diff = parse_diff(diff_text)
    if not diff.added and not diff.removed:
        failed.append(Finding("the diff changes no line"))
    asserting = None
    if contract.must_start.strip():
        asserting = _emits(diff, contract.must_start, failed, passed)
    else:
        failed.append(Finding(
            "the contract promises no must-start event, so no diff can show that it ships the fix: add one "
            "(trace-repro contract add --fingerprint <fp> --signature <sig> --must-start <event>) and emit it"
        ))  # fmt: skip
    _keeps_reporting(diff, _reported_names(contract), failed, passed)
    if contract.issue is not None and proves is not None:
        if contract.issue == proves:
            passed.append(f"the contract is the one of issue #{proves}")
        else:
            failed.append(Finding(f"the contract is for issue #{contract.issue}, the description proves #{proves}"))
    if run is not None:
        _tests_ran(run, asserting, failed, passed)
    return GateResult(not failed, tuple(f.text for f in failed), tuple(passed), proves, tuple(failed))


# ---- reports -------------------------------------------------------------------------------------------------


def read_junit(text: str) -> TestRun:
    """The test cases of a JUnit XML report (``<testsuites>`` or one ``<testsuite>``); ValueError if it is not one.

    A skipped test neither passes nor fails; a test case with a ``<failure>`` or ``<error>`` failed.
    """
    try:
        root = ET.fromstring(text)  # noqa: S314 - the job's own pytest wrote it; expat limits entity amplification
    except ET.ParseError as exc:
        raise ValueError(f"not XML: {exc}") from exc
    if root.tag not in ("testsuites", "testsuite"):
        raise ValueError(f"not a JUnit report: root element <{root.tag}>")
    total = 0
    ok: set[tuple[str, str]] = set()
    failures: list[str] = []
    for case in root.iter("testcase"):
        total += 1
        cls, name = case.get("classname", ""), case.get("name", "")
        bad = next((c for c in case if c.tag in ("failure", "error")), None)
        if bad is not None:
            message = " ".join((bad.get("message") or bad.tag).split())[:200]
            failures.append(f"{cls}::{name}: {message}")
        elif case.find("skipped") is None:
            ok.add((cls, name))
    return TestRun(total, frozenset(ok), tuple(failures))


def code_quality(result: GateResult, default_path: str) -> list[dict[str, object]]:
    """GitLab Code Quality issues, one per failed check (none when the gate passed); repo-relative locations."""
    issues: list[dict[str, object]] = []
    for f in result.findings:
        path = f.path or default_path
        digest = hashlib.sha256(f"trace-repro-gate\n{path}\n{f.text}".encode("utf-8", "surrogatepass")).hexdigest()
        issues.append({
            "description": f"trace-repro gate: {f.text}",
            "check_name": "trace-repro/gate",
            "fingerprint": digest,
            "severity": "blocker",
            "location": {"path": path, "lines": {"begin": max(f.line, 1)}},
        })  # fmt: skip
    return issues


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
    p.add_argument("--contract", required=True, help="the proof contract (JSON; `contract add --write` writes one)")
    p.add_argument("--commits", help="the MR's commit messages (git log --format=%%B base..head): no closing keyword")
    p.add_argument("--junit", help="JUnit XML of the MR's tests (pytest --junitxml): they must have run and passed")
    p.add_argument("--codequality", help="also write the failures here as a GitLab Code Quality report (JSON)")


def _write_code_quality(path: str | None, result: GateResult, default_path: str) -> None:
    if path:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(code_quality(result, default_path), indent=2) + "\n")


def _unusable(args: argparse.Namespace, why: str) -> int:
    print(f"trace-repro gate: {why}", file=sys.stderr)
    _write_code_quality(args.codequality, GateResult(False, (why,), findings=(Finding(why),)), args.contract)
    return 2


def run(args: argparse.Namespace) -> int:
    """Run the gate on parsed arguments; print the reasons; 0 pass, 1 fail, 2 unusable input."""
    try:
        diff, description = _read(args.diff), _read(args.description)
        commits = _read(args.commits) if args.commits else None
    except OSError as exc:
        return _unusable(args, str(exc))
    try:
        contract = ProofContract.model_validate_json(_read(args.contract))
    except FileNotFoundError:
        return _unusable(args, f"no proof contract at {args.contract}: write it with `trace-repro contract add "
                               f"--fingerprint <fp> --signature <sig> --must-start <event> --issue <N> --write "
                               f"{args.contract}` and commit it with the merge request")  # fmt: skip
    except (OSError, ValidationError) as exc:
        return _unusable(args, f"unusable proof contract {args.contract}: {exc}")
    tests: TestRun | None = None
    if args.junit:
        try:
            tests = read_junit(_read(args.junit))
        except FileNotFoundError:
            tests = TestRun(0, frozenset(), ())  # the tests did not even write their report: nothing ran
        except (OSError, ValueError) as exc:
            return _unusable(args, f"unusable JUnit report {args.junit}: {exc}")
    result = check(diff, description, contract, tests, commits)
    _write_code_quality(args.codequality, result, args.contract)
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
