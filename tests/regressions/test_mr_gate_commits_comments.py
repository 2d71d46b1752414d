"""The gate reads the MR's commit messages (a closing keyword there closes the issue on merge) and counts only code
that emits the must-start event: a comment or a docstring that names it emits nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from processors.model.contract import ProofContract
from streamer.gate import check, main
from tests.regressions.test_mr_gate import CONTRACT, GOOD_DESCRIPTION, GOOD_DIFF

EMIT = '        log.info("rounded", extra={"event.name": "split.rounded"})'


@pytest.mark.parametrize(
    "commits",
    ["Distribute leftover cents\n\nFixes #42\n", "fix rounding\n\nCloses group/shop#42\n",
     "largest remainder\n\nResolves https://gitlab.example/g/p/-/issues/42\n"],
)  # fmt: skip
def test_a_closing_keyword_in_a_commit_message_fails(commits: str) -> None:
    """The description proves #42, but a commit message closes it: GitLab would close the issue on merge."""
    result = check(GOOD_DIFF, GOOD_DESCRIPTION, CONTRACT, commits=commits)
    assert not result.ok
    assert [r for r in result.reasons if r.startswith("closing keyword(s) in a commit message")], result.reasons


def test_commit_messages_without_a_closing_keyword_pass() -> None:
    """ "Proves #42" in a commit message is what trace-repro's own commits say: it passes."""
    result = check(GOOD_DIFF, GOOD_DESCRIPTION, CONTRACT, commits="trace-repro: prove #42\n\nProves #42\n")
    assert result.ok, result.reasons
    assert "no closing keyword in the commit messages" in result.passed


def test_the_command_line_reads_the_commit_messages(tmp_path: Path) -> None:
    """``--commits F``: exit 1 when a commit message says "Fixes #42", exit 0 without it."""
    files = {"mr.diff": GOOD_DIFF, "description.md": GOOD_DESCRIPTION, "contract.json": CONTRACT.model_dump_json(),
             "bad.txt": "round cents\n\nFixes #42\n", "good.txt": "round cents\n"}  # fmt: skip
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    args = ["--diff", str(tmp_path / "mr.diff"), "--description", str(tmp_path / "description.md"),
            "--contract", str(tmp_path / "contract.json")]  # fmt: skip
    assert main([*args, "--commits", str(tmp_path / "bad.txt")]) == 1
    assert main([*args, "--commits", str(tmp_path / "good.txt")]) == 0


@pytest.mark.parametrize(
    "instead",
    ['        # emits split.rounded once the leftover is spread',
     '        pass  # log split.rounded here',
     '        """Emits split.rounded."""',
     "        'split.rounded'"],
)  # fmt: skip
def test_an_event_named_only_in_a_comment_does_not_count(instead: str) -> None:
    """The event named in a comment, a trailing comment, a docstring or a bare string: nothing emits it."""
    diff = GOOD_DIFF.replace(EMIT, instead)
    result = check(diff, GOOD_DESCRIPTION, CONTRACT)
    assert not result.ok
    assert result.reasons == (
        "no added line outside the tests emits the must-start event 'split.rounded' (named only in a comment or "
        "docstring at app/split.py:14)",
    )


def test_a_multi_line_docstring_naming_the_event_does_not_count() -> None:
    """A docstring added whole, over several lines, with the event on a middle line, is a docstring."""
    doc = '        """Spread the leftover.\n+\n+        Emits split.rounded when it does.\n+        """'
    diff = GOOD_DIFF.replace(EMIT, doc).replace("@@ -10,4 +10,8 @@", "@@ -10,4 +10,11 @@")
    result = check(diff, GOOD_DESCRIPTION, CONTRACT)
    assert not result.ok and result.reasons[0].startswith("no added line outside the tests emits")


def test_an_emission_with_a_comment_beside_it_counts() -> None:
    """Code that emits the event still counts when a comment on its line names the event too."""
    diff = GOOD_DIFF.replace(EMIT, EMIT + "  # split.rounded: the proof's event")
    assert check(diff, GOOD_DESCRIPTION, CONTRACT).ok


@pytest.mark.parametrize(
    ("line", "emits"),
    [('  logger.info("split.rounded"); // split.rounded', True), ("  // logger.info('split.rounded');", False),
     ("   * emits split.rounded", False), ('  const url = "http://x/#split.rounded"', True)],
)  # fmt: skip
def test_other_languages_drop_line_and_block_comments(line: str, emits: bool) -> None:
    """Outside Python: ``//`` and ``#`` outside quotes, and block-comment lines, are comments."""
    contract = ProofContract(signature="error:*:RoundingError", fingerprint="fp", must_start="split.rounded")
    diff = GOOD_DIFF.replace(
        "diff --git a/app/split.py b/app/split.py\n--- a/app/split.py\n+++ b/app/split.py",
        "diff --git a/app/split.ts b/app/split.ts\n--- a/app/split.ts\n+++ b/app/split.ts",
    )
    diff = diff.replace(EMIT, line)
    emitted = not any("emits the must-start event" in r for r in check(diff, GOOD_DESCRIPTION, contract).reasons)
    assert emitted is emits


def test_the_ci_job_refuses_a_commit_that_says_fixes(tmp_path: Path) -> None:
    """The gate job reads the MR's commit messages (git log base..head): a proving MR whose commit says "Fixes #7"
    fails the job, though its description only says "Proves #7"."""
    from tests.regressions.test_ci_template import SPLIT_FIXED, _git, checkout, run_job

    repo, base = checkout(tmp_path, SPLIT_FIXED)
    _git(repo, "commit", "-q", "--amend", "-m", "distribute leftover cents\n\nFixes #7")
    run = run_job(repo, base, "Distribute leftover cents by largest remainder.\n\nProves #7\n")
    assert run.returncode == 1, run.output
    assert "FAIL  closing keyword(s) in a commit message would close the issue on merge: ['Fixes #7']" in run.output
