"""What a "Proves #N" merge request commits besides the test and the repair, so that it passes its own gate.

- **The contract** of the issue (its *Proof contract* section, :mod:`sinks.gitlab.contract_section`) as
  ``.trace-repro/contracts/<N>.json``: the gate reads it from there.
- **The promised event in the repaired code**: each repaired function gets the line that emits the contract's
  must-start event after its repaired statement (:mod:`processors.repair.emit_event`).
- **A test that asserts it**, appended to the generated test: an application-level repro runs the repaired
  functions in the recorded interleaving with a tracer that records the spans started, and asserts the event's;
  a statement-level repro (which replays SQL, not the code) checks that the repaired module's source starts it.
- **The incident's proof job** ``.gitlab/trace-repro/proof-<N>.yml`` (:func:`proof_job`): one job per incident,
  ``trace-repro-proof-<N>``, runs the generated test against a PostgreSQL service (``postgres:16``) with the
  variables the test reads (``REPRO_DSN``, ``REPRO_SOURCE_ROOT``), and keeps its JUnit report as an artifact with
  repository-relative paths (``trace-repro-reports/proof-<N>/junit.xml``), which the gate job judges. It runs in
  the ``.pre`` stage, so that its artifacts reach the gate job of the ``test`` stage. The CI configuration includes
  them all with one wildcard entry, :data:`PROOF_INCLUDE`.
"""

from __future__ import annotations

import json

from processors.model.contract import EVENT_NAME, ProofContract

PROOF_DIR = ".gitlab/trace-repro"
PROOF_INCLUDE = f"{PROOF_DIR}/*.yml"  # one include for every incident's job: the MRs of several incidents edit the
# CI configuration alike, so they merge one after the other without a conflict
POSTGRES_IMAGE = "postgres:16"
TEST_NAME = "test_the_repair_emits_the_promised_event"


def proof_job_path(issue_iid: int) -> str:
    return f"{PROOF_DIR}/proof-{issue_iid}.yml"


def proof_report_dir(issue_iid: int) -> str:
    return f"trace-repro-reports/proof-{issue_iid}"


def proof_job(issue_iid: int, test_path: str) -> str:
    """The CI job of issue ``issue_iid``: its generated test against PostgreSQL, with a JUnit report (see module)."""
    reports = proof_report_dir(issue_iid)
    rule = rf"/\bProves\s+#{issue_iid}\b/i"
    test = json.dumps(test_path)  # a plain relative path (merge_requests._test_path); quoted for the shell anyway
    return f"""# trace-repro: the proof job of issue #{issue_iid}, committed with the merge request that proves it.
#
# It runs the issue's generated test ({test_path}) against a PostgreSQL service, as the repro ran it when the
# daemon proved the repair, and keeps the JUnit report for the gate job (trace-repro-gate, in .gitlab/). The image
# needs python3 with pytest, psycopg and the application's dependencies: override `image` in .gitlab-ci.yml.

trace-repro-proof-{issue_iid}:
  stage: .pre
  image: python:3.12
  services:
    - name: {POSTGRES_IMAGE}
      alias: postgres
  variables:
    POSTGRES_PASSWORD: trace-repro
    REPRO_DSN: postgresql://postgres:trace-repro@postgres:5432/postgres
    REPRO_SOURCE_ROOT: $CI_PROJECT_DIR
  rules:
    - if: '$CI_PIPELINE_SOURCE == "merge_request_event" && $CI_MERGE_REQUEST_DESCRIPTION =~ {rule}'
  script:
    - cd "$CI_PROJECT_DIR" && mkdir -p {reports}
    - python -m pytest -p no:cacheprovider {test} --junitxml={reports}/junit.xml
  artifacts:
    when: always
    expire_in: 30 days
    paths:
      - {reports}/
    reports:
      junit: {reports}/junit.xml
"""


def emit_test(event: str, level: str, repaired_files: list[str]) -> str:
    """The test appended to the generated test module: it asserts that the repaired code emits ``event``."""
    if not EVENT_NAME.match(event):
        raise ValueError(f"not an event name: {event!r}")
    head = (
        "\n\n# ---- trace-repro: the repair emits the proof contract's must-start event "
        + "-" * 38
        + f'\nPROMISED_EVENT = "{event}"\n\n\n'
    )
    if level == "app":
        return (
            head
            + f'''def {TEST_NAME}(monkeypatch: pytest.MonkeyPatch) -> None:
    """The repaired functions, run in the recorded interleaving, start a span named after the must-start event (what
    the proof judge counts in production)."""
    import opentelemetry.trace

    started: list[str] = []

    class Recorder:  # the tracer the repaired code reaches: records the names of the spans it starts
        def start_span(self, name: str, *args: Any, **kwargs: Any) -> Any:
            started.append(name)
            return opentelemetry.trace.INVALID_SPAN

    monkeypatch.setattr(opentelemetry.trace, "get_tracer", lambda *args, **kwargs: Recorder())
    play(monkeypatch, None)
    assert "{event}" in started, f"the repaired code started the spans {{started}}, not the promised event"
'''
        )
    files = json.dumps(sorted(repaired_files))
    return (
        head
        + f'''def {TEST_NAME}() -> None:
    """The repaired modules start a span named after the must-start event (a statement-level repro replays the SQL,
    not the code: the repaired source is read instead)."""
    import ast
    import pathlib

    root = pathlib.Path(os.environ.get("REPRO_SOURCE_ROOT") or ".")
    names = set()
    for path in {files}:
        tree = ast.parse((root / path).read_text(encoding="utf-8"))
        names |= {{a.value for n in ast.walk(tree) if isinstance(n, ast.Call) for a in n.args
                  if isinstance(a, ast.Constant) and isinstance(a.value, str)}}
    assert "{event}" in names, "no repaired module starts the promised event's span"
'''
    )


def contract_file(contract: ProofContract) -> str:
    """The contract as the merge request commits it (as ``trace-repro contract add --write`` writes it)."""
    return json.dumps(json.loads(contract.model_dump_json()), indent=2) + "\n"


__all__ = [
    "PROOF_DIR",
    "PROOF_INCLUDE",
    "TEST_NAME",
    "contract_file",
    "emit_test",
    "proof_job",
    "proof_job_path",
    "proof_report_dir",
]
