"""The "Proves #N" merge request as opened passes its own gate: it commits the issue's contract, the repaired code
emits the promised event, a test asserts it, and the incident's proof job runs the test against PostgreSQL. The gate
runs on the diff, description, commits and contract read back from the GitLab API (the local server)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import gitlab
import yaml

from bench.gitlab_server import FakeGitLab
from bench.mr_path import gate_inputs, write_inputs
from processors.model.contract import ProofContract
from sinks.gitlab import ci_job, contract_section, proof_files
from streamer.gate import main as gate
from tests.gitlab.conftest import SinkFactory
from tests.gitlab.helpers import FIXTURES, PROJECT, TOKEN, deliver, incident, repro
from tests.regressions.test_ci_template import JOB_KEYWORDS

EVENT = contract_section.promised_event(incident().fingerprint)


def _project(server: FakeGitLab) -> object:
    return gitlab.Gitlab(server.url, private_token=TOKEN).projects.get(PROJECT)


async def _open(server: FakeGitLab, make_sink: SinkFactory) -> None:
    server.seed_file("bench/shop/jobs.py", (FIXTURES / "jobs_before.py.txt").read_text())
    await deliver(make_sink(merge_requests=True), incident(), repro())


async def test_the_merge_request_as_opened_passes_the_gate(
    server: FakeGitLab, make_sink: SinkFactory, tmp_path: Path
) -> None:
    """Open the MR on the local GitLab, read its diff, description, commits and contract over the API, run
    ``trace-repro gate``: exit 0, with the emission in the repaired file and the assertion in the test."""
    await _open(server, make_sink)
    inputs = gate_inputs(_project(server), 1)
    assert inputs.proves == 1 and inputs.contract is not None
    contract = ProofContract.model_validate_json(inputs.contract)
    assert (contract.must_start, contract.issue) == (EVENT, 1)
    assert contract == contract_section.contract(server.issues()[0]["description"], 1)  # the issue's contract
    args = write_inputs(inputs, tmp_path)
    assert gate(args) == 0
    assert json.loads((tmp_path / "gl-code-quality-report.json").read_text()) == []
    added = [line for line in inputs.diff.splitlines() if line.startswith("+") and EVENT in line]
    assert any("start_span" in line for line in added)  # the repaired code emits it
    assert any(line.startswith("+    assert") for line in added)  # the test asserts it


async def test_the_proof_job_runs_the_test_against_postgresql(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """One job per incident, included by the CI configuration: the generated test with a PostgreSQL service and
    the variables the test reads, its JUnit report at a repository-relative path."""
    await _open(server, make_sink)
    [mr] = server.merge_requests()
    branch = mr["source_branch"]
    job_file = server.file(proof_files.proof_job_path(1), branch)
    assert job_file is not None
    job = yaml.safe_load(job_file)["trace-repro-proof-1"]
    assert job["services"] == [{"name": "postgres:16", "alias": "postgres"}]
    assert (
        job["variables"]["REPRO_DSN"].startswith("postgresql://postgres:")
        and "@postgres:5432/" in job["variables"]["REPRO_DSN"]
    )
    assert job["variables"]["REPRO_SOURCE_ROOT"] == "$CI_PROJECT_DIR"
    assert any(repro().test_path in line and "--junitxml=trace-repro-reports/proof-1/junit.xml" in line
               for line in job["script"])  # fmt: skip
    for path in [*job["artifacts"]["paths"], job["artifacts"]["reports"]["junit"]]:
        assert not path.startswith(("/", "$")) and ".." not in path.split("/")
    ci = server.file(".gitlab-ci.yml", branch)
    assert ci is not None and {"local": proof_files.PROOF_INCLUDE} in yaml.safe_load(ci)["include"]
    assert "trace-repro-reports/proof-$N/junit.xml" in ci_job.GATE_JOB  # the gate judges the proof job's report


async def test_merged_the_issue_stays_open_and_a_fixes_commit_would_close_it(
    server: FakeGitLab, make_sink: SinkFactory
) -> None:
    """Merged as opened, the issue stays open (it closes on FIXED); the local GitLab closes an issue a commit
    message says "Fixes #1" about on merge, which is why the gate refuses that commit."""
    await _open(server, make_sink)
    project = _project(server)
    mr = project.mergerequests.get(1)  # type: ignore[attr-defined]
    mr.merge()
    assert server.merge_requests()[0]["state"] == "merged" and server.issues()[0]["state"] == "opened"
    assert server.file("bench/shop/jobs.py", "main") is not None and EVENT in (server.file("bench/shop/jobs.py") or "")
    other = incident(fingerprint="c0ffee")
    await deliver(make_sink(), other)
    project.branches.create({"branch": "hotfix", "ref": "main"})  # type: ignore[attr-defined]
    project.commits.create({"branch": "hotfix", "commit_message": "hotfix\n\nFixes #2",  # type: ignore[attr-defined]
                            "actions": [{"action": "create", "file_path": "x.txt", "content": "x"}]})  # fmt: skip
    project.mergerequests.create({"source_branch": "hotfix", "target_branch": "main", "title": "Proves #2",  # type: ignore[attr-defined]
                                  "description": "Proves #2"}).merge()  # fmt: skip
    assert server.issues()[1]["state"] == "closed"


async def test_two_incidents_merge_requests_merge_one_after_the_other(
    server: FakeGitLab, make_sink: SinkFactory
) -> None:
    """Both MRs are opened from the same main: their CI configuration edits are the same (one wildcard include for
    every proof job), so the second merges after the first without a conflict."""
    await _open(server, make_sink)
    other = repro().model_copy(update={"fingerprint": "c0ffee", "test_path": "tests/repro/test_other.py", "patch": "",
                                       "repairs": []})  # another defect, repaired elsewhere  # fmt: skip
    await deliver(make_sink(merge_requests=True), incident(fingerprint="c0ffee"), other)
    project = _project(server)
    for iid in (1, 2):
        project.mergerequests.get(iid).merge()  # type: ignore[attr-defined]
    assert [m["state"] for m in server.merge_requests()] == ["merged", "merged"]
    for n in (1, 2):
        assert server.file(proof_files.proof_job_path(n)) is not None
        assert server.file(ci_job.contract_path(n)) is not None


def test_the_proof_job_is_gitlab_ci_and_shell() -> None:
    """Only GitLab CI keywords, in the stage before the gate's (so the gate gets its report); each line valid shell."""
    job = yaml.safe_load(proof_files.proof_job(7, ".trace-repro/ab12/test_repro.py"))["trace-repro-proof-7"]
    assert set(job) <= {*JOB_KEYWORDS, "services"} and job["stage"] == ".pre"
    for line in job["script"]:
        assert subprocess.run(["bash", "-n", "-c", line], check=False).returncode == 0, line
