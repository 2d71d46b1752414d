"""The GitLab CI template of the gate (config/gitlab-ci/trace-repro-gate.yml): keywords, rules, shell, and the job
itself, run locally in a git checkout with the CI variables of a merge-request pipeline."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from sinks.gitlab import ci_job
from streamer.gate import PROVES

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "config" / "gitlab-ci" / "trace-repro-gate.yml"
JOB = "trace-repro-gate"
VENV_BIN = Path(sys.executable).parent

# The GitLab CI keywords this template may use (https://docs.gitlab.com/ci/yaml/), by where they may appear.
GLOBAL_KEYWORDS = {"include", "stages", "variables", "default", "workflow"}
JOB_KEYWORDS = {"stage", "image", "variables", "rules", "before_script", "script", "after_script", "artifacts",
                "needs", "when", "allow_failure", "interruptible", "timeout", "tags"}  # fmt: skip
RULE_KEYWORDS = {"if", "changes", "exists", "when", "allow_failure", "variables"}
ARTIFACT_KEYWORDS = {"paths", "reports", "when", "expire_in", "name", "expose_as", "exclude"}
REPORT_KEYWORDS = {"junit", "codequality"}
WHEN = {"always", "on_success", "on_failure", "never", "manual"}
RULE_IF = re.compile(
    r'^\$CI_PIPELINE_SOURCE == "merge_request_event" && \$CI_MERGE_REQUEST_DESCRIPTION =~ /(?P<re>.+)/(?P<flags>i?)$'
)


def template() -> dict[str, Any]:
    data = yaml.safe_load(TEMPLATE.read_text())
    assert isinstance(data, dict)
    return data


def job() -> dict[str, Any]:
    spec = template()[JOB]
    assert isinstance(spec, dict)
    return spec


def test_yaml_is_pyyaml_from_the_dev_dependencies() -> None:
    """The validation below needs a real YAML parser: PyYAML, installed with the dev dependencies."""
    assert yaml.__version__


def test_every_key_is_a_known_gitlab_ci_keyword() -> None:
    """Top level: one job (no reserved name); in it, in its rules and artifacts, only GitLab CI keywords."""
    data = template()
    assert set(data) == {JOB} and JOB not in GLOBAL_KEYWORDS
    spec = job()
    assert set(spec) <= JOB_KEYWORDS, set(spec) - JOB_KEYWORDS
    assert isinstance(spec["stage"], str) and isinstance(spec["image"], str)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in spec["variables"].items())
    for rule in spec["rules"]:
        assert set(rule) <= RULE_KEYWORDS, set(rule) - RULE_KEYWORDS
        assert rule.get("when", "on_success") in WHEN
    artifacts = spec["artifacts"]
    assert set(artifacts) <= ARTIFACT_KEYWORDS, set(artifacts) - ARTIFACT_KEYWORDS
    assert set(artifacts["reports"]) <= REPORT_KEYWORDS and artifacts["when"] in WHEN
    assert re.fullmatch(r"\d+ (?:day|week|month)s?", artifacts["expire_in"])
    for key in ("before_script", "script"):
        assert spec[key] and all(isinstance(line, str) and line.strip() for line in spec[key])


def test_report_paths_are_repository_relative() -> None:
    """GitLab uploads artifacts by paths relative to the project directory: no absolute path, no '..'."""
    artifacts = job()["artifacts"]
    paths = [*artifacts["paths"], artifacts["reports"]["junit"], artifacts["reports"]["codequality"]]
    for path in paths:
        assert not path.startswith(("/", "$", "~")) and ".." not in Path(path).parts, path
    assert artifacts["reports"]["codequality"].endswith(".json") and artifacts["reports"]["junit"].endswith(".xml")


def test_every_script_line_is_valid_shell() -> None:
    """Each line (a YAML comment can cut a plain scalar at ' #') parses on its own as shell, and so do all of them."""
    spec = job()
    lines = [*spec["before_script"], *spec["script"]]
    for line in lines:
        check = subprocess.run(["bash", "-n", "-c", line], capture_output=True, text=True, check=False)
        assert check.returncode == 0, (line, check.stderr)
    assert subprocess.run(["bash", "-n", "-c", "\n".join(lines)], check=False).returncode == 0


@pytest.mark.parametrize(
    ("description", "runs"),
    [("Proves #7", True), ("Distribute cents.\n\nProves #12\n", True), ("proves  #7", True), ("PROVES #7", True),
     ("Fixes #7", False), ("Improves #7", False), ("Proves 7", False), ("Proves #", False), ("", False)],
)  # fmt: skip
def test_the_rule_runs_the_job_exactly_when_the_gate_reads_a_proves(description: str, runs: bool) -> None:
    """The job runs on merge-request pipelines whose description the gate reads as 'Proves #N', and only those."""
    [rule] = job()["rules"]
    m = RULE_IF.match(rule["if"])
    assert m is not None, rule["if"]
    rule_re = re.compile(m["re"], re.IGNORECASE if m["flags"] == "i" else 0)
    assert (rule_re.search(description) is not None) is runs
    assert (PROVES.search(description) is not None) is runs


def test_the_sink_commits_this_template_byte_for_byte() -> None:
    """The package carries the template (the wheel has no config/): it is the file, byte for byte."""
    assert TEMPLATE.read_text() == ci_job.GATE_JOB


@pytest.mark.parametrize(
    ("ci", "kept"),
    [
        (None, []),
        ("stages: [build, test]\n\nbuild:\n  stage: build\n  script: [make]  # the build\n", ["build"]),
        ("include:\n  - project: ops/ci\n    file: base.yml\n\nunit:\n  script: [pytest]\n", ["unit"]),
        ("# header\ninclude:   # shared jobs\n\n    - template: Security/SAST.gitlab-ci.yml\nlint:\n  script: [ruff]\n",
         ["lint"]),
    ],
)  # fmt: skip
def test_with_include_adds_the_job_and_keeps_the_rest(ci: str | None, kept: list[str]) -> None:
    """No configuration, one without include, and a block-list include: the result includes the job file, keeps
    every job and include it had, and is already final (a second edit changes nothing)."""
    edited = ci_job.with_include(ci)
    assert edited is not None
    data = yaml.safe_load(edited)
    assert {"local": ci_job.GATE_JOB_PATH} in data["include"]
    before = yaml.safe_load(ci) if ci else {}
    for name in kept:
        assert data[name] == before[name]
    old_includes = before.get("include") or []
    assert all(i in data["include"] for i in old_includes) and len(data["include"]) == len(old_includes) + 1
    assert ci_job.with_include(edited) == edited


@pytest.mark.parametrize("ci", ["include: base.yml\n", "include: [a.yml, b.yml]\n", "include:\n  local: a.yml\n"])
def test_with_include_leaves_other_include_forms_alone(ci: str) -> None:
    """A string, flow-list or map include is not edited by text (the merge request asks a person instead)."""
    assert ci_job.with_include(ci) is None


# ---- the job, run locally ----------------------------------------------------------------------------------------

SPLIT_BEFORE = '''\
"""Splitting a total into shares."""

import logging

log = logging.getLogger(__name__)


class RoundingError(ValueError):
    """The shares do not add up to the total."""


def allocate(total, weights):
    shares = [total * w // sum(weights) for w in weights]
    if sum(shares) != total:
        raise RoundingError(f"shares sum to {sum(shares)}")
    return shares
'''
SPLIT_FIXED = SPLIT_BEFORE.replace(
    "    if sum(shares) != total:\n",
    "    leftover = total - sum(shares)\n"
    "    if leftover:\n"
    "        by_remainder = sorted(range(len(weights)), key=lambda i: -(total * weights[i] % sum(weights)))\n"
    "        for i in by_remainder[:leftover]:\n"
    "            shares[i] += 1\n"
    '        log.info("rounded", extra={"event.name": "split.rounded"})\n'
    "    if sum(shares) != total:\n",
)
SPLIT_HIDDEN = SPLIT_BEFORE.replace(
    '    if sum(shares) != total:\n        raise RoundingError(f"shares sum to {sum(shares)}")\n',
    "    shares[0] += total - sum(shares)\n",
)
TEST_SPLIT = """\
import logging

from app.split import allocate


def test_even():
    assert allocate(100, [1, 1]) == [50, 50]


def test_leftover_cents_are_rounded(caplog):
    caplog.set_level(logging.INFO)
    assert sorted(allocate(100, [1, 1, 1])) == [33, 33, 34]
    assert "split.rounded" in [getattr(r, "event.name", "") for r in caplog.records]
"""


@dataclass
class JobRun:
    returncode: int
    output: str
    checkout: Path

    def artifact(self, key: str) -> Path:
        """The file the artifacts section names under ``reports.<key>``, in the checkout."""
        return self.checkout / str(job()["artifacts"]["reports"][key])


def _git(repo: Path, *args: str) -> str:
    cmd = ["git", "-c", "user.name=trace-repro test", "-c", "user.email=test@example.invalid",
           "-c", "commit.gpgsign=false", "-C", str(repo), *args]  # fmt: skip
    env = {"PATH": os.environ["PATH"], "HOME": str(repo.parent), "GIT_CONFIG_NOSYSTEM": "1", "LANG": "C.UTF-8"}
    return subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout.strip()


def _write(repo: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _contract(repo: Path, issue: int, must_start: str) -> str:
    """The contract as `trace-repro contract add --write` writes it, for committing with the MR."""
    path = ci_job.contract_path(issue)
    subprocess.run(
        [str(VENV_BIN / "trace-repro"), "contract", "add", "--fingerprint", "b98839ad1b70ae75", "--signature",
         "error:*:RoundingError", "--must-start", must_start, "--issue", str(issue), "--reports", "RoundingError",
         "--dry-run", "--write", path],
        cwd=repo, capture_output=True, text=True, check=True, env=_base_env(repo.parent),
    )  # fmt: skip
    return path


def _base_env(home: Path) -> dict[str, str]:
    """What a CI runner gives a job: a PATH (with the venv's trace-repro and python), a HOME; no secrets."""
    return {"PATH": f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
            "GIT_CONFIG_NOSYSTEM": "1"}  # fmt: skip


def checkout(tmp_path: Path, split_after: str, *, must_start: str | None = "split.rounded") -> tuple[Path, str]:
    """A git repository: the app with the defect on main, then the MR's commit (fix, test, contract) on a branch."""
    repo = tmp_path / "app"
    repo.mkdir()
    _git(repo, "init", "-q", "-b", "main")
    _write(repo, {"app/__init__.py": "", "app/split.py": SPLIT_BEFORE, "pytest.ini": "[pytest]\n",
                  "tests/test_even.py": "from app.split import allocate\n\n\ndef test_even():\n"
                                        "    assert allocate(100, [1, 1]) == [50, 50]\n"})  # fmt: skip
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "the app, with the rounding defect")
    base = _git(repo, "rev-parse", "HEAD")
    _git(repo, "checkout", "-q", "-b", "trace-repro/b98839ad1b70ae75")
    _write(repo, {"app/split.py": split_after, "tests/test_split.py": TEST_SPLIT})
    if must_start is not None:
        _contract(repo, 7, must_start)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "distribute leftover cents")
    return repo, base


def run_job(repo: Path, base: str, description: str) -> JobRun:
    """The job's before_script and script, as a GitLab runner runs them (bash, -e, pipefail), with the variables of
    a merge-request pipeline and the job's own."""
    spec = job()
    env = _base_env(repo.parent)
    env.update({k: str(v) for k, v in spec["variables"].items()})
    env.update({
        "CI": "true", "GITLAB_CI": "true", "CI_PIPELINE_SOURCE": "merge_request_event", "CI_PROJECT_DIR": str(repo),
        "CI_MERGE_REQUEST_DESCRIPTION": description, "CI_MERGE_REQUEST_DIFF_BASE_SHA": base,
        "CI_MERGE_REQUEST_IID": "3", "CI_COMMIT_SHA": _git(repo, "rev-parse", "HEAD"),
        "TRACE_REPRO_PYTEST_ARGS": "-p no:cacheprovider",
    })  # fmt: skip
    script = "\n".join(["set -eo pipefail", *spec["before_script"], *spec["script"]])
    done = subprocess.run(["bash", "-c", script], cwd=repo, env=env, capture_output=True, text=True, timeout=600,
                          check=False)  # fmt: skip
    return JobRun(done.returncode, done.stdout + done.stderr, repo)


def _junit_cases(path: Path) -> dict[str, str]:
    root = ET.parse(path).getroot()
    return {
        f"{c.get('classname')}::{c.get('name')}": next((x.tag for x in c if x.tag in ("failure", "error")), "passed")
        for c in root.iter("testcase")
    }


def test_the_job_passes_a_proving_merge_request(tmp_path: Path) -> None:
    """A fix that emits the must-start event, a test asserting it, the contract committed: the job passes, with the
    JUnit report of the MR's tests and an empty Code Quality report where the artifacts section says."""
    repo, base = checkout(tmp_path, SPLIT_FIXED)
    run = run_job(repo, base, "Distribute leftover cents by largest remainder.\n\nProves #7\n")
    assert run.returncode == 0, run.output
    assert "gate PASSED for error:*:RoundingError (must start 'split.rounded')" in run.output
    assert (
        "the test that asserts the must-start event passed (tests/test_split.py::test_leftover_cents_are_rounded)"
        in run.output
    )
    assert _junit_cases(run.artifact("junit")) == {
        "tests.test_split::test_even": "passed",
        "tests.test_split::test_leftover_cents_are_rounded": "passed",
    }
    assert json.loads(run.artifact("codequality").read_text()) == []


def test_the_job_fails_a_merge_request_that_hides_the_defect(tmp_path: Path) -> None:
    """A 'fix' that drops the raise and emits nothing: the test fails, the gate fails; both reports are written,
    the Code Quality issues located at repository-relative paths of the checkout."""
    repo, base = checkout(tmp_path, SPLIT_HIDDEN)
    run = run_job(repo, base, "Proves #7")
    assert run.returncode == 1, run.output
    assert "gate FAILED" in run.output
    for reason in ("no added line outside the tests emits the must-start event 'split.rounded'",
                   "removes the code that reports RoundingError: app/split.py:",
                   "a test failed: tests.test_split::test_leftover_cents_are_rounded",
                   "the test that asserts the must-start event did not pass in this run: "
                   "tests/test_split.py::test_leftover_cents_are_rounded"):  # fmt: skip
        assert f"FAIL  {reason}" in run.output, reason
    assert _junit_cases(run.artifact("junit"))["tests.test_split::test_leftover_cents_are_rounded"] == "failure"
    issues = json.loads(run.artifact("codequality").read_text())
    assert len(issues) == 4 and {i["severity"] for i in issues} == {"blocker"}
    assert len({i["fingerprint"] for i in issues}) == 4
    removed = next(i for i in issues if "removes the code" in i["description"])
    assert removed["location"] == {"path": "app/split.py", "lines": {"begin": 15}}
    for issue in issues:
        path = issue["location"]["path"]
        assert not Path(path).is_absolute() and (repo / path).is_file(), path


def test_the_job_refuses_a_contract_without_a_must_start_event(tmp_path: Path) -> None:
    """The daemon's own contracts promise no event: the gate says so, and how to add one."""
    repo, base = checkout(tmp_path, SPLIT_FIXED, must_start="")
    run = run_job(repo, base, "Proves #7")
    assert run.returncode == 1, run.output
    assert "FAIL  the contract promises no must-start event, so no diff can show that it ships the fix" in run.output
    assert "--must-start <event>" in run.output


def test_the_job_without_a_committed_contract_says_how_to_write_one(tmp_path: Path) -> None:
    """No contract file in the MR: unusable input (exit 2), the command that writes it, and a Code Quality issue."""
    repo, base = checkout(tmp_path, SPLIT_FIXED, must_start=None)
    run = run_job(repo, base, "Proves #7")
    assert run.returncode == 2, run.output
    assert "no proof contract at .trace-repro/contracts/7.json" in run.output
    assert "--write .trace-repro/contracts/7.json" in run.output
    [issue] = json.loads(run.artifact("codequality").read_text())
    assert issue["location"]["path"] == ".trace-repro/contracts/7.json"


def test_the_job_checks_the_contract_is_the_proved_issues(tmp_path: Path) -> None:
    """A contract for issue #7 does not prove #8."""
    repo, base = checkout(tmp_path, SPLIT_FIXED)
    shutil.copy(repo / ci_job.contract_path(7), repo / ci_job.contract_path(8))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "contract for 8")
    run = run_job(repo, base, "Proves #8")
    assert run.returncode == 1, run.output
    assert "FAIL  the contract is for issue #7, the description proves #8" in run.output
