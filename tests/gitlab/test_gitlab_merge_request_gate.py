"""The merge request the sink opens carries the gate: the job file, the include in the CI configuration, and a
description that says "Proves #N" and where the gate reads the contract (against the fake GitLab server)."""

from __future__ import annotations

import re

import yaml

from bench.gitlab_server import FakeGitLab
from sinks.gitlab import ci_job, proof_files
from sinks.gitlab.merge_requests import safe_fingerprint
from streamer.gate import CLOSING, PROVES
from tests.gitlab.conftest import SinkFactory
from tests.gitlab.helpers import FIXTURES, deliver, incident, repro

BRANCH = f"trace-repro/{incident().fingerprint}"
PROOF_JOB = proof_files.proof_job_path(1)
INCLUDES = [{"local": proof_files.PROOF_INCLUDE}, {"local": ci_job.GATE_JOB_PATH}]  # every incident's proof job


def _seed_app(server: FakeGitLab) -> None:
    server.seed_file("bench/shop/jobs.py", (FIXTURES / "jobs_before.py.txt").read_text())


async def test_the_merge_request_carries_the_gate_job(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """A project without CI configuration: the MR adds the job file and a .gitlab-ci.yml that includes it; the
    description proves the issue (as the job's rule and the gate read it) and names the contract to commit."""
    _seed_app(server)
    await deliver(make_sink(merge_requests=True), incident(), repro())
    [mr] = server.merge_requests()
    assert server.file(ci_job.GATE_JOB_PATH, BRANCH) == ci_job.GATE_JOB
    ci = server.file(".gitlab-ci.yml", BRANCH)
    assert ci is not None and yaml.safe_load(ci) == {"include": INCLUDES}
    assert server.file(".gitlab-ci.yml", "main") is None and server.file(ci_job.GATE_JOB_PATH, "main") is None
    description = mr["description"]
    proves = PROVES.search(description)
    assert proves is not None and proves[1] == "1" and not CLOSING.search(description)
    rule = yaml.safe_load(ci_job.GATE_JOB)["trace-repro-gate"]["rules"][0]["if"]
    rule_re = re.search(r"=~ /(.+)/i$", rule)
    assert rule_re is not None and re.search(rule_re[1], description, re.IGNORECASE)
    assert "`.trace-repro/contracts/1.json`" in description and "included by `.gitlab-ci.yml`" in description
    assert "from the issue's *Proof contract* section" in description and f"`{PROOF_JOB}`" in description


async def test_an_existing_configuration_gets_the_include_and_keeps_the_rest(
    server: FakeGitLab, make_sink: SinkFactory
) -> None:
    """The application's .gitlab-ci.yml keeps its jobs and includes; the job file joins its include list; a replay
    commits nothing more."""
    _seed_app(server)
    original = "include:\n  - template: Security/SAST.gitlab-ci.yml\n\nunit:\n  script: [pytest]  # the suite\n"
    server.seed_file(".gitlab-ci.yml", original)
    await deliver(make_sink(merge_requests=True), incident(), repro())
    ci = server.file(".gitlab-ci.yml", BRANCH)
    assert ci is not None and "# the suite" in ci
    data = yaml.safe_load(ci)
    assert data["include"] == [*INCLUDES, {"template": "Security/SAST.gitlab-ci.yml"}]
    assert data["unit"] == {"script": ["pytest"]} and server.file(".gitlab-ci.yml", "main") == original
    commits = len(server.store.data["commits"])
    await deliver(make_sink(merge_requests=True), repro())
    assert len(server.store.data["commits"]) == commits and len(server.merge_requests()) == 1


async def test_a_configuration_it_cannot_edit_is_left_alone(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """`include: base.yml` is not edited by text: the job file is committed and the description says what to add."""
    _seed_app(server)
    server.seed_file(".gitlab-ci.yml", "include: base.yml\n")
    await deliver(make_sink(merge_requests=True), incident(), repro())
    [mr] = server.merge_requests()
    assert server.file(".gitlab-ci.yml", BRANCH) == "include: base.yml\n"
    assert server.file(ci_job.GATE_JOB_PATH, BRANCH) == ci_job.GATE_JOB
    assert "could not be edited safely" in mr["description"]
    assert f"`- local: {ci_job.GATE_JOB_PATH}`" in mr["description"]


async def test_the_projects_ci_config_path_is_the_one_edited(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """A project whose pipeline lives in ci/pipeline.yml gets the include there, not a new .gitlab-ci.yml."""
    _seed_app(server)
    server.store.data["project"]["ci_config_path"] = "ci/pipeline.yml"
    server.seed_file("ci/pipeline.yml", "lint:\n  script: [ruff]\n")
    await deliver(make_sink(merge_requests=True), incident(), repro())
    ci = server.file("ci/pipeline.yml", BRANCH)
    assert ci is not None and all(i in yaml.safe_load(ci)["include"] for i in INCLUDES)
    assert server.file(".gitlab-ci.yml", BRANCH) is None


async def test_a_crafted_fingerprint_names_no_other_branch_or_path(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """A fingerprint with '..', slashes and spaces becomes a plain name in the branch and the patch path, and a
    test path outside the repository is committed under .trace-repro/ instead."""
    crafted = "../../main x"
    await deliver(make_sink(merge_requests=True), incident(fingerprint=crafted),
                  repro().model_copy(update={"fingerprint": crafted, "test_path": "../.gitlab-ci.yml"}))  # fmt: skip
    [mr] = server.merge_requests()
    safe = safe_fingerprint(crafted)
    assert re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*", safe) and ".." not in safe
    assert mr["source_branch"] == f"trace-repro/{safe}"
    files = server.store.data["branches"][mr["source_branch"]]["files"]
    assert f".trace-repro/{safe}.patch" in files and f".trace-repro/{safe}/test_repro.py" in files
    assert all(".." not in path.split("/") for path in files)
    assert yaml.safe_load(files[".gitlab-ci.yml"]) == {"include": INCLUDES}
