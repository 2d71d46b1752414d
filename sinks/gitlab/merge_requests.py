"""The "Proves #N" merge request of a proven repro: a branch, one commit of the test and the repair, the MR.

With ``merge_requests=True`` a proven :class:`~processors.model.outputs.ReproEvent` gets a branch
``trace-repro/<fingerprint>`` from the target branch (the configured one, or the project's default), a commit of
the generated test and the repaired files (the repro's patch applied strictly by :mod:`sinks.gitlab.patching`;
a patch that does not apply is committed as ``.trace-repro/<fingerprint>.patch`` instead, and the MR says so),
and a merge request whose description starts with ``Proves #N``, never a closing keyword: only a FIXED verdict
on the deployed build closes the issue. The issue gets a note linking the MR.

The MR carries the gate (:mod:`sinks.gitlab.ci_job`): the job file ``.gitlab/trace-repro-gate.yml`` and an
``include:`` of it in the project's CI configuration (``.gitlab-ci.yml``, or the project's ``ci_config_path`` when
that is a file of the repository), so the MR's own pipeline runs ``trace-repro gate``. A configuration whose
``include:`` cannot be edited safely is left alone and the description says what to add. The description also
says where the gate reads the proof contract (``.trace-repro/contracts/<N>.json``) and how to write it.

Every name derived from the fingerprint (branch, patch file) keeps only ``[A-Za-z0-9_.-]``: a crafted fingerprint
cannot name another branch or a path outside ``.trace-repro/``.

:meth:`MergeRequests.prove` is one idempotent step (see :mod:`sinks.gitlab.issues`): an open MR from the branch
is reused, the branch is created only if missing, files already committed with the wanted content are not
committed again, and a 409 on creation (another instance opened it meanwhile) picks up that MR.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import structlog
from gitlab.exceptions import GitlabError

from processors.api.telemetry import Telemetry
from processors.model.contract import ProofContract
from processors.model.outputs import ReproEvent
from processors.repair.emit_event import EmitError, emit_after_repair
from sinks.gitlab import ci_job, contract_section, patching, proof_files
from sinks.gitlab.body_repro import GateSetup, merge_request_description, merge_request_note, merge_request_title
from sinks.gitlab.issues import IssueRef, Issues

log = structlog.get_logger("trace_repro.gitlab")

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_TEST_PATH = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]*\.py")


def safe_fingerprint(fingerprint: str) -> str:
    """The fingerprint as a branch and file name: ``[A-Za-z0-9_.-]`` only, no ``..``, no leading dot, bounded."""
    name = _UNSAFE.sub("_", fingerprint).replace("..", "_").lstrip(".")[:64]
    return name or "unknown"


def _test_path(e: ReproEvent) -> str:
    """Where the test is committed: its own path when that is a plain relative ``.py`` path, else under
    ``.trace-repro/<fingerprint>/`` (a repro cannot overwrite the CI configuration or leave the repository)."""
    parts = e.test_path.split("/")
    if _TEST_PATH.fullmatch(e.test_path) and not any(p in ("", ".", "..") for p in parts):
        return e.test_path
    return f".trace-repro/{safe_fingerprint(e.fingerprint)}/test_repro.py"


@dataclass(frozen=True, slots=True)
class _Repair:
    applied: bool  # the patch applied (else it is committed as ``patch_path``)
    patch_path: str | None
    files: dict[str, str | None]  # path -> content to commit (None = delete)


class MergeRequests:
    """Opens the merge request that proves an issue; see the module docstring."""

    def __init__(self, issues: Issues, *, target_branch: str | None, telemetry: Telemetry) -> None:
        self.issues = issues
        self.target_branch = target_branch
        self.telemetry = telemetry

    def _file(self, path: str, ref: str) -> str | None:
        try:
            raw: bytes = self.issues.project.files.raw(file_path=path, ref=ref)
        except GitlabError as exc:
            if exc.response_code == 404:
                return None
            raise
        return raw.decode()

    def prove(self, ref: IssueRef, e: ReproEvent) -> None:
        """Open (or find) the MR of ``e``'s branch and note it on the issue ``ref``."""
        project = self.issues.project
        branch = f"trace-repro/{safe_fingerprint(e.fingerprint)}"
        target = self.target_branch or str(project.default_branch or "main")
        existing = project.mergerequests.list(source_branch=branch, state="opened", get_all=True)
        if existing:
            mr_iid = int(existing[0].iid)
        else:
            try:
                project.branches.get(branch)
            except GitlabError as exc:
                if exc.response_code != 404:
                    raise
                project.branches.create({"branch": branch, "ref": target})
            repair = self._repaired_files(e, target)
            contract = contract_section.contract(project.issues.get(ref.iid).description, ref.iid)
            proof = self._proof_files(e, ref.iid, target, repair, contract)
            gate, ci_files = self._gate_files(target, ref.iid, {**repair.files, **proof}, contract)
            actions = []
            for path, content in {**repair.files, **proof, **ci_files}.items():
                current = self._file(path, branch)
                if current == content:
                    continue  # committed by an earlier attempt
                if content is None:
                    actions.append({"action": "delete", "file_path": path})
                else:
                    kind = "create" if current is None else "update"
                    actions.append({"action": kind, "file_path": path, "content": content})
            if actions:
                project.commits.create({"branch": branch, "actions": actions,
                                        "commit_message": f"trace-repro: prove #{ref.iid}"})  # fmt: skip
            mr_iid = self._open(branch, target, ref, e, repair, gate)
            self.telemetry.count("merge_requests")
            log.info("gitlab.merge_request", fingerprint=e.fingerprint, iid=mr_iid, issue=ref.iid)
        self.issues.note_once(ref, f"merge-request-{branch}", merge_request_note(mr_iid, branch))

    def _open(self, branch: str, target: str, ref: IssueRef, e: ReproEvent, repair: _Repair, gate: GateSetup) -> int:
        project = self.issues.project
        description = merge_request_description(e, ref.iid, applied=repair.applied, patch_path=repair.patch_path,
                                                gate=gate)  # fmt: skip
        try:
            mr: Any = project.mergerequests.create({
                "source_branch": branch, "target_branch": target, "title": merge_request_title(e, ref.iid),
                "description": description,
                "labels": list(self.issues.labels),
            })  # fmt: skip
        except GitlabError as exc:
            if exc.response_code != 409:
                raise
            # Opened meanwhile by another instance.
            mr = project.mergerequests.list(source_branch=branch, state="opened", get_all=True)[0]
        return int(mr.iid)

    def _repaired_files(self, e: ReproEvent, target: str) -> _Repair:
        """The test and the repaired files, or the test and the patch as a file when it does not apply."""
        wanted: dict[str, str | None] = {_test_path(e): e.test_source}
        if not e.patch:
            return _Repair(True, None, wanted)
        try:
            changed: dict[str, str | None] = {}
            for fp in patching.parse(e.patch):
                before = self._file(fp.old_path, target) if fp.old_path else None
                changed[fp.path] = patching.apply(before, fp)
            wanted.update(changed)
            return _Repair(True, None, wanted)
        except patching.PatchError as exc:
            log.warning("gitlab.patch_not_applied", fingerprint=e.fingerprint, error=str(exc)[:200])
            path = f".trace-repro/{safe_fingerprint(e.fingerprint)}.patch"
            wanted[path] = e.patch
            return _Repair(False, path, wanted)

    def _proof_files(self, e: ReproEvent, issue_iid: int, target: str, repair: _Repair,
                     contract: ProofContract | None) -> dict[str, str | None]:  # fmt: skip
        """The issue's contract, the promised event emitted by the repaired functions and a test asserting it, and
        the incident's proof job (:mod:`sinks.gitlab.proof_files`); nothing without a contract that promises one."""
        if contract is None or not contract.must_start:
            return {}
        files: dict[str, str | None] = {ci_job.contract_path(issue_iid): proof_files.contract_file(contract)}
        test_path = _test_path(e)
        files[proof_files.proof_job_path(issue_iid)] = proof_files.proof_job(issue_iid, test_path)
        if not repair.applied:
            return files
        emitting: list[str] = []
        for r in e.repairs:
            after = files.get(r.file, repair.files.get(r.file))
            if after is None:
                continue
            try:
                files[r.file] = emit_after_repair(after, r.function, contract.must_start,
                                                  before=self._file(r.file, target))  # fmt: skip
                emitting.append(r.file)
            except EmitError as exc:
                log.warning("gitlab.event_not_emitted", fingerprint=e.fingerprint, file=r.file, error=str(exc)[:200])
        test = repair.files.get(test_path)
        if emitting and test is not None and proof_files.TEST_NAME not in test:
            files[test_path] = test + proof_files.emit_test(contract.must_start, e.level, sorted(set(emitting)))
        return files

    def _gate_files(self, target: str, issue_iid: int, repaired: dict[str, str | None],
                    contract: ProofContract | None = None) -> tuple[GateSetup, dict[str, str | None]]:  # fmt: skip
        """The gate job file and the CI configuration that includes it and the issue's proof job (left out when it
        cannot be edited)."""
        files: dict[str, str | None] = {ci_job.GATE_JOB_PATH: ci_job.GATE_JOB}
        proof = proof_files.proof_job_path(issue_iid) if proof_files.proof_job_path(issue_iid) in repaired else None
        configured = str(getattr(self.issues.project, "ci_config_path", None) or "").strip()
        ci_path = configured or ci_job.CI_CONFIG_PATH
        setup = GateSetup(ci_path, included=False, contract=ci_job.contract_path(issue_iid), committed=contract,
                          proof_job=proof if proof else "")  # fmt: skip
        if "@" in ci_path or "://" in ci_path:  # a configuration in another project or at a URL
            return setup, files
        current = repaired[ci_path] if ci_path in repaired else self._file(ci_path, target)
        edited = ci_job.with_include(current)
        if edited is not None and proof is not None:
            edited = ci_job.with_include(edited, proof_files.PROOF_INCLUDE)
        if edited is not None and edited != current:
            files[ci_path] = edited
        return replace(setup, included=edited is not None), files


__all__ = ["MergeRequests", "safe_fingerprint"]
