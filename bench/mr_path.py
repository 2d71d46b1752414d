"""The merge-request path as a GitLab pipeline sees it: the inputs of ``trace-repro gate``, read from GitLab's API.

A merge-request pipeline hands the gate job the MR's diff (``git diff $CI_MERGE_REQUEST_DIFF_BASE_SHA``), its
description (``$CI_MERGE_REQUEST_DESCRIPTION``), its commit messages (``git log base..head``) and the contract
committed on its branch. :func:`gate_inputs` reads the same four things over the REST API (``/merge_requests/:iid``,
``/diffs``, ``/commits``, ``/repository/files/:path/raw``) with python-gitlab, and :func:`write_inputs` writes them as
the files the gate takes, so ``make demo`` and the tests run the gate on exactly what the merge request holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gitlab.exceptions import GitlabError

from sinks.gitlab import ci_job
from streamer.gate import PROVES


@dataclass(frozen=True, slots=True)
class GateInputs:
    """What the gate reads, for one merge request."""

    iid: int
    source_branch: str
    proves: int | None
    diff: str
    description: str
    commits: str
    contract: str | None  # the committed contract's JSON, None when the branch has none


def _file_diff(d: dict[str, Any]) -> str:
    old = "/dev/null" if d.get("new_file") else f"a/{d['old_path']}"
    new = "/dev/null" if d.get("deleted_file") else f"b/{d['new_path']}"
    body = str(d.get("diff") or "")
    return f"diff --git a/{d['old_path']} b/{d['new_path']}\n--- {old}\n+++ {new}\n{body}"


def gate_inputs(project: Any, mr_iid: int) -> GateInputs:
    """The gate's inputs for merge request ``mr_iid`` of ``project`` (a python-gitlab Project)."""
    mr = project.mergerequests.get(mr_iid)
    gl = project.manager.gitlab
    diffs = gl.http_list(f"/projects/{project.id}/merge_requests/{mr_iid}/diffs", get_all=True)
    diff = "".join(_file_diff(d) for d in diffs)
    commits = "\n".join(str(c.message).rstrip("\n") + "\n" for c in mr.commits(get_all=True))
    description = str(mr.description or "")
    found = PROVES.search(description)
    proves = int(found[1]) if found else None
    contract = None
    if proves is not None:
        try:
            raw: bytes = project.files.raw(file_path=ci_job.contract_path(proves), ref=mr.source_branch)
            contract = raw.decode()
        except GitlabError as exc:
            if exc.response_code != 404:
                raise
            contract = None  # no contract committed: the gate reports it
    return GateInputs(int(mr.iid), str(mr.source_branch), proves, diff, description, commits, contract)


def write_inputs(inputs: GateInputs, directory: Path) -> list[str]:
    """Write the inputs as files; the ``trace-repro gate`` arguments that read them (without ``--junit``)."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {"mr.diff": inputs.diff, "description.md": inputs.description, "commits.txt": inputs.commits}
    for name, text in files.items():
        (directory / name).write_text(text)
    contract = directory / "contract.json"
    if inputs.contract is not None:
        contract.write_text(inputs.contract)
    return ["--diff", str(directory / "mr.diff"), "--description", str(directory / "description.md"),
            "--commits", str(directory / "commits.txt"), "--contract", str(contract),
            "--codequality", str(directory / "gl-code-quality-report.json")]  # fmt: skip


__all__ = ["GateInputs", "gate_inputs", "write_inputs"]
