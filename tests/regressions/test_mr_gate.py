"""The proof-of-fix merge-request gate: description keywords, must-start emission and test, reporting code kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from processors.model.contract import ProofContract
from streamer.diffs import parse_diff
from streamer.gate import TestRun, check, is_test_path, main, read_junit

CONTRACT = ProofContract(signature="error:*:RoundingError", fingerprint="fp", must_start="split.rounded")
GOOD_DESCRIPTION = "Distribute leftover cents by largest remainder.\n\nProves #42\n"
GOOD_DIFF = """\
diff --git a/app/split.py b/app/split.py
--- a/app/split.py
+++ b/app/split.py
@@ -10,4 +10,8 @@ def allocate(total, weights):
     shares = [total * w // sum(weights) for w in weights]
-    if sum(shares) != total:
-        raise RoundingError(f"shares sum to {sum(shares)}")
+    leftover = total - sum(shares)
+    if leftover:
+        shares = largest_remainder(shares, leftover)
+        log.info("rounded", extra={"event.name": "split.rounded"})
+    if sum(shares) != total:
+        raise RoundingError(f"shares sum to {sum(shares)}")
     return shares
diff --git a/tests/test_split.py b/tests/test_split.py
--- a/tests/test_split.py
+++ b/tests/test_split.py
@@ -1,2 +1,5 @@ import split
 def test_even():
     assert split.allocate(100, [1, 1]) == [50, 50]
+def test_rounded(caplog):
+    split.allocate(100, [1, 1, 1])
+    assert "split.rounded" in events(caplog)
"""


def test_a_proper_proof_of_fix_passes_with_its_reasons() -> None:
    """Proves #42, emits the event, a test asserts it, and the RoundingError report only moved: the gate passes."""
    result = check(GOOD_DIFF, GOOD_DESCRIPTION, CONTRACT)
    assert result.ok, result.reasons
    assert result.proves == 42 and result.reasons == ()
    assert any("emits 'split.rounded' at app/split.py:14" in p for p in result.passed)
    assert any("asserts 'split.rounded' at tests/test_split.py:5" in p for p in result.passed)
    assert any("reports RoundingError stays" in p for p in result.passed)


@pytest.mark.parametrize(
    "description",
    ["Closes #42", "Proves #42, fixes #42", "Proves #42\nResolves: group/proj#42",
     "Proves #42 and implements https://gitlab.example/g/p/-/issues/42"],
)  # fmt: skip
def test_closing_keywords_or_a_missing_proves_fail(description: str) -> None:
    """A closing keyword would close the issue on merge, before production proved anything."""
    result = check(GOOD_DIFF, description, CONTRACT)
    assert not result.ok
    assert any("closing keyword" in r or "Proves #" in r for r in result.reasons)


def test_no_emission_outside_the_tests_fails() -> None:
    """The event only in a test file is asserted but never emitted by the code."""
    diff = GOOD_DIFF.replace('log.info("rounded", extra={"event.name": "split.rounded"})', "pass")
    result = check(diff, GOOD_DESCRIPTION, CONTRACT)
    assert result.reasons == ("no added line outside the tests emits the must-start event 'split.rounded'",)


def test_a_contract_without_a_must_start_event_is_refused() -> None:
    """An empty event name would be "emitted" by every line: the gate refuses the contract, saying why."""
    result = check(GOOD_DIFF, GOOD_DESCRIPTION, CONTRACT.model_copy(update={"must_start": ""}))
    assert not result.ok
    assert any("promises no must-start event" in r for r in result.reasons)


def test_a_test_that_mentions_the_event_without_asserting_it_fails() -> None:
    """Mentioning the event name in a test without an assertion is not a test of it."""
    diff = GOOD_DIFF.replace('+    assert "split.rounded" in events(caplog)', '+    print("split.rounded")')
    result = check(diff, GOOD_DESCRIPTION, CONTRACT)
    assert result.reasons == ("no added test line asserts the must-start event 'split.rounded'",)


def test_a_multi_line_assertion_counts() -> None:
    """The event on a continuation line of an assertion that starts just above it is asserted."""
    diff = GOOD_DIFF.replace(
        "@@ -1,2 +1,5 @@ import split", "@@ -1,2 +1,7 @@ import split").replace(
        '+    assert "split.rounded" in events(caplog)\n',
        '+    assert events(caplog) == [\n+        "split.rounded",\n+    ]\n')  # fmt: skip
    assert check(diff, GOOD_DESCRIPTION, CONTRACT).ok


def test_deleting_the_code_that_reports_the_error_fails() -> None:
    """Removing the raise of RoundingError without an equivalent is hiding the defect, not fixing it."""
    diff = GOOD_DIFF.replace(
        "@@ -10,4 +10,8 @@", "@@ -10,4 +10,6 @@").replace(
        '+    if sum(shares) != total:\n+        raise RoundingError(f"shares sum to {sum(shares)}")\n',
        "")  # fmt: skip
    result = check(diff, GOOD_DESCRIPTION, CONTRACT)
    assert result.reasons == (
        'removes the code that reports RoundingError: app/split.py:12: raise RoundingError(f"shares sum to '
        '{sum(shares)}")',
    )


def test_swallowing_the_error_fails() -> None:
    """An added except RoundingError: pass silences the signature the contract watches."""
    diff = GOOD_DIFF.replace(
        "     return shares\n", "+    try:\n+        check(shares)\n+    except RoundingError:\n+        pass\n"
        "     return shares\n").replace("@@ -10,4 +10,8 @@", "@@ -10,4 +10,12 @@")  # fmt: skip
    result = check(diff, GOOD_DESCRIPTION, CONTRACT)
    assert result.reasons == ("swallows RoundingError: app/split.py:19: except RoundingError:",)


def test_collision_contract_protects_the_exceptions_it_names() -> None:
    """A collision contract without 'reports' has nothing to protect; with one it guards that exception."""
    plain = ProofContract(signature="lost_update:orders:a+b", fingerprint="fp", must_start="split.rounded")
    assert any("names no reporting code" in p for p in check(GOOD_DIFF, GOOD_DESCRIPTION, plain).passed)
    named = plain.model_copy(update={"reports": ["app.errors.RoundingError"]})
    assert check(GOOD_DIFF, GOOD_DESCRIPTION, named).ok


def test_diff_parser_reads_hunks_by_their_counts() -> None:
    """A removed line starting with '--' inside a hunk is a removed line, not a file header; numbers follow hunks."""
    diff = parse_diff("--- a/x.sql\n+++ b/x.sql\n@@ -3,2 +3,2 @@\n--- a comment\n+-- a new comment\n same\n")
    assert [(d.path, d.number, d.text) for d in diff.removed] == [("x.sql", 3, "-- a comment")]
    assert [(d.path, d.number, d.text) for d in diff.added] == [("x.sql", 3, "-- a new comment")]
    miscounted = parse_diff("--- a/a.py\n+++ b/a.py\n@@ -1,9 +1,9 @@\n+x\ndiff --git a/b.py b/b.py\n"
                            "--- a/b.py\n+++ b/b.py\n@@ -1 +1 @@\n-y\n+z\n")  # fmt: skip
    assert [(d.path, d.text) for d in miscounted.added] == [("a.py", "x"), ("b.py", "z")]
    assert [(d.path, d.text) for d in miscounted.removed] == [("b.py", "y")]
    assert is_test_path("tests/test_split.py") and is_test_path("web/Split.test.ts") and is_test_path("a/b_test.go")
    assert not is_test_path("app/split.py") and not is_test_path("app/contest.py")


def test_main_exit_codes_and_readable_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 0 and 'gate PASSED' for a good MR, 1 with FAIL lines for a bad one, 2 for an unreadable contract."""
    (tmp_path / "mr.diff").write_text(GOOD_DIFF)
    (tmp_path / "good.md").write_text(GOOD_DESCRIPTION)
    (tmp_path / "bad.md").write_text("Fixes #42")
    (tmp_path / "c.json").write_text(CONTRACT.model_dump_json())
    (tmp_path / "broken.json").write_text("{}")
    args = ["--diff", str(tmp_path / "mr.diff"), "--contract", str(tmp_path / "c.json")]
    assert main([*args, "--description", str(tmp_path / "good.md")]) == 0
    assert "gate PASSED for error:*:RoundingError" in capsys.readouterr().out
    assert main([*args, "--description", str(tmp_path / "bad.md")]) == 1
    out = capsys.readouterr().out
    assert "gate FAILED" in out and "FAIL  closing keyword" in out and 'FAIL  the description must say "Proves' in out
    broken = ["--diff", str(tmp_path / "mr.diff"), "--description", str(tmp_path / "good.md"), "--contract",
              str(tmp_path / "broken.json")]  # fmt: skip
    assert main(broken) == 2


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="2">
<testcase classname="tests.test_split" name="test_even" time="0.001" />
<testcase classname="tests.test_split" name="test_rounded" time="0.001">{outcome}</testcase>
</testsuite></testsuites>"""


def test_the_contract_committed_with_the_fix_does_not_emit_the_event() -> None:
    """The contract file names the event, but naming it in the contract or the CI job is not emitting it."""
    committed = ("diff --git a/.trace-repro/contracts/42.json b/.trace-repro/contracts/42.json\n"
                 "--- /dev/null\n+++ b/.trace-repro/contracts/42.json\n@@ -0,0 +1 @@\n"
                 '+{"must_start": "split.rounded"}\n')  # fmt: skip
    diff = GOOD_DIFF.replace('log.info("rounded", extra={"event.name": "split.rounded"})', "pass") + committed
    result = check(diff, GOOD_DESCRIPTION, CONTRACT)
    assert result.reasons == ("no added line outside the tests emits the must-start event 'split.rounded'",)


def test_the_test_run_must_pass_the_asserting_test_function() -> None:
    """With a JUnit report: the added test function that asserts the event must have passed, not just its file."""
    green = read_junit(JUNIT.format(outcome=""))
    assert check(GOOD_DIFF, GOOD_DESCRIPTION, CONTRACT, green).ok
    red = read_junit(JUNIT.format(outcome='<failure message="AssertionError: nope">trace</failure>'))
    assert check(GOOD_DIFF, GOOD_DESCRIPTION, CONTRACT, red).reasons == (
        "a test failed: tests.test_split::test_rounded: AssertionError: nope",
        "the test that asserts the must-start event did not pass in this run: tests/test_split.py::test_rounded",
    )
    skipped = read_junit(JUNIT.format(outcome='<skipped message="later" />'))
    assert not check(GOOD_DIFF, GOOD_DESCRIPTION, CONTRACT, skipped).ok
    assert check(GOOD_DIFF, GOOD_DESCRIPTION, CONTRACT, TestRun(0, frozenset(), ())).reasons == (
        "no test ran: the JUnit report holds no test case",
    )
    with pytest.raises(ValueError, match="not a JUnit report"):
        read_junit("<html/>")


def test_a_contract_for_another_issue_fails() -> None:
    """The description proves #42; a contract written for #41 is not its proof."""
    result = check(GOOD_DIFF, GOOD_DESCRIPTION, CONTRACT.model_copy(update={"issue": 41}))
    assert result.reasons == ("the contract is for issue #41, the description proves #42",)
    assert check(GOOD_DIFF, GOOD_DESCRIPTION, CONTRACT.model_copy(update={"issue": 42})).ok


def test_code_quality_report_locates_each_failure(tmp_path: Path) -> None:
    """--codequality writes one blocker per failure, at the diff line or else at the contract, and [] on a pass."""
    (tmp_path / "mr.diff").write_text(GOOD_DIFF.replace(
        '+    if sum(shares) != total:\n+        raise RoundingError(f"shares sum to {sum(shares)}")\n', "").replace(
        "@@ -10,4 +10,8 @@", "@@ -10,4 +10,6 @@"))  # fmt: skip
    (tmp_path / "good.md").write_text(GOOD_DESCRIPTION)
    (tmp_path / "bad.md").write_text("Fixes #42")
    (tmp_path / "c.json").write_text(CONTRACT.model_dump_json())
    report = tmp_path / "reports" / "cq.json"
    args = ["--diff", str(tmp_path / "mr.diff"), "--contract", "c.json", "--codequality", str(report)]
    assert main([*args, "--description", str(tmp_path / "bad.md")]) == 2  # c.json relative to cwd: not there
    [unusable] = json.loads(report.read_text())
    assert unusable["location"]["path"] == "c.json" and "no proof contract at c.json" in unusable["description"]
    args[3] = str(tmp_path / "c.json")
    assert main([*args, "--description", str(tmp_path / "bad.md")]) == 1
    issues = json.loads(report.read_text())
    assert [(i["location"]["path"], i["location"]["lines"]["begin"]) for i in issues] == [
        (str(tmp_path / "c.json"), 1), (str(tmp_path / "c.json"), 1), ("app/split.py", 12)]  # fmt: skip
    assert all(i["severity"] == "blocker" and i["check_name"] == "trace-repro/gate" for i in issues)
    (tmp_path / "mr.diff").write_text(GOOD_DIFF)
    assert main([*args, "--description", str(tmp_path / "good.md")]) == 0
    assert json.loads(report.read_text()) == []
