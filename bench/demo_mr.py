"""``make demo``'s merge-request path: repair → "Proves #N" MR → its own gate passes → merged → the merge deployed.

The local GitLab holds the shop's source on ``main`` (:func:`seed_repository`), so the daemon's GitLab sink (with
``merge_requests`` on) opens, for each proven repro, a merge request that commits the generated test, the repair
with the promised event, the issue's contract and the CI jobs. For each one :func:`prove_and_merge` does what the
MR's pipeline does: it checks the branch out, runs the tests the MR adds against the local PostgreSQL with
``pytest --junitxml`` (as the proof job does against its PostgreSQL service), runs ``trace-repro gate`` on the
diff, description, commit messages and contract read from the GitLab API (:mod:`bench.mr_path`) and that JUnit
report, and merges the MR when the gate passes. :func:`deploy_merged` then deploys ``main`` as merged: the build
the proof judge watches is the one the merge requests made.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gitlab

from bench.gitlab_server import FakeGitLab
from bench.mr_path import gate_inputs, write_inputs
from processors.repro.runner import environment
from streamer.diffs import parse_diff
from streamer.gate import main as gate
from streamer.gate_code import is_test_path

SHOP_FILES = ("bench/__init__.py", "bench/shop")


@dataclass(frozen=True, slots=True)
class MergeRequestRun:
    """What became of one merge request in the demo."""

    iid: int
    proves: int | None
    branch: str
    tests: tuple[str, ...]
    junit: str  # "3 passed", "1 failed, 2 passed"
    gate: int  # trace-repro gate's exit code
    gate_output: str
    merged: bool


def seed_repository(server: FakeGitLab, repo: Path) -> int:
    """The shop's source (``bench/__init__.py`` and ``bench/shop/``) on the local GitLab's main branch."""
    count = 0
    for name in SHOP_FILES:
        path = repo / name
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for f in files:
            if "__pycache__" in f.parts:
                continue
            server.seed_file(f.relative_to(repo).as_posix(), f.read_text())
            count += 1
    return count


def wait_merge_requests(server: FakeGitLab, count: int, timeout_s: float) -> list[dict[str, Any]]:
    """The open merge requests, once ``count`` are there (or the timeout passed)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        mrs = [m for m in server.merge_requests() if m["state"] == "opened"]
        if len(mrs) >= count:
            return mrs
        time.sleep(0.5)
    return [m for m in server.merge_requests() if m["state"] == "opened"]


def checkout(server: FakeGitLab, branch: str, into: Path) -> Path:
    """The branch's files written under ``into``."""
    with server.store.lock:
        files = dict(server.store.data["branches"][branch]["files"])
    for name, text in files.items():
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return into


def _junit_summary(path: Path) -> str:
    import xml.etree.ElementTree as ET

    if not path.exists():
        return "no report"
    root = ET.parse(path).getroot()
    cases = list(root.iter("testcase"))
    failed = sum(1 for c in cases if any(x.tag in ("failure", "error") for x in c))
    return f"{len(cases) - failed} passed" + (f", {failed} failed" if failed else "")


def prove_and_merge(server: FakeGitLab, token: str, dsn: str, work: Path) -> list[MergeRequestRun]:
    """Each open merge request's pipeline, run here: its tests (JUnit), the gate, and the merge when it passes."""
    project = gitlab.Gitlab(server.url, private_token=token).projects.get(server.project_path)
    runs = []
    for mr in sorted(server.merge_requests(), key=lambda m: int(m["iid"])):
        if mr["state"] != "opened":
            continue
        iid = int(mr["iid"])
        here = work / f"mr-{iid}"
        inputs = gate_inputs(project, iid)
        repo = checkout(server, inputs.source_branch, here / "repo")
        tests = sorted(
            {a.path for a in parse_diff(inputs.diff).added if is_test_path(a.path) and a.path.endswith(".py")}
        )
        junit = here / "junit.xml"
        env = environment(dsn=dsn, trace=here / "trace.json", statement_timeout_ms=5000, source_root=str(repo))
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull,
                        "--rootdir", str(repo), *tests, f"--junitxml={junit}"],
                       cwd=repo, env=env, capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = gate([*write_inputs(inputs, here / "gate"), "--junit", str(junit)])
        merged = False
        if code == 0:
            project.mergerequests.get(iid).merge()
            merged = True
        runs.append(MergeRequestRun(iid, inputs.proves, inputs.source_branch, tuple(tests), _junit_summary(junit),
                                    code, out.getvalue(), merged))  # fmt: skip
    return runs


def deploy_merged(server: FakeGitLab, into: Path) -> Path:
    """``main`` as merged, written to ``into`` (the build deployed as the next version)."""
    return checkout(server, "main", into)


def show(runs: list[MergeRequestRun], server: FakeGitLab) -> None:
    """The merge-request path's lines of the demo's summary."""
    states = {int(i["iid"]): i["state"] for i in server.issues()}
    for r in runs:
        gate_word = "PASSED" if r.gate == 0 else f"FAILED (exit {r.gate})"
        issue = f"#{r.proves} {states.get(r.proves or 0, '?')}" if r.proves else "no Proves #N"
        print(f"   !{r.iid:<3} Proves {issue:<12} tests {r.junit:<18} gate {gate_word:<16} "
              f"{'merged' if r.merged else 'NOT merged'}  ({r.branch})")  # fmt: skip
        if r.gate != 0:
            print("      " + r.gate_output.strip().replace("\n", "\n      "))


__all__ = ["MergeRequestRun", "checkout", "deploy_merged", "prove_and_merge", "seed_repository", "show",
           "wait_merge_requests"]  # fmt: skip
