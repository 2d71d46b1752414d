"""The CI job a "Proves #N" merge request carries: trace-repro's gate, and the include that runs it.

:data:`GATE_JOB` is ``config/gitlab-ci/trace-repro-gate.yml`` byte for byte (a test holds them equal; the package
ships without ``config/``). The merge request commits it as :data:`GATE_JOB_PATH`, a file of its own that the
application's CI configuration includes, rather than a job pasted into that configuration: the application keeps
its pipeline as it wrote it, the next trace-repro merge request finds the job already there, and updating the job
is replacing one file. :func:`with_include` adds the ``include:`` by editing text, never by re-serialising YAML
(comments, anchors and key order stay): it appends a top-level ``include:`` when there is none, adds an entry to a
block-sequence ``include:``, and gives up (None) on any other form, which the merge request then asks a person to
edit.
"""

from __future__ import annotations

import re

GATE_JOB_PATH = ".gitlab/trace-repro-gate.yml"
CI_CONFIG_PATH = ".gitlab-ci.yml"
CONTRACTS_DIR = ".trace-repro/contracts"

GATE_JOB = r"""# trace-repro: the proof-of-fix gate for merge requests that say "Proves #N" (an issue it filed).
#
# Include it in the application's .gitlab-ci.yml (trace-repro's own merge requests commit this file as
# .gitlab/trace-repro-gate.yml and add the include):
#
#   include:
#     - local: .gitlab/trace-repro-gate.yml
#
# The job runs in merge-request pipelines only (a `workflow:rules` that allows branch pipelines only keeps it out)
# and only when the description says "Proves #N" (GitLab cuts CI_MERGE_REQUEST_DESCRIPTION at 2,700 characters:
# keep it near the top, as trace-repro does). It
#   1. takes N from the description, and the proof contract from .trace-repro/contracts/N.json, committed with the
#      merge request (`trace-repro contract add ... --issue N --write .trace-repro/contracts/N.json`);
#   2. runs the Python test files the merge request adds or changes (or TRACE_REPRO_TESTS) with pytest --junitxml,
#      unless the issue's proof job (trace-repro-proof-N, .gitlab/trace-repro/proof-N.yml, committed with
#      trace-repro's own merge requests: the generated test against PostgreSQL) left its JUnit report;
#   3. runs `trace-repro gate` on the diff, the description, the commit messages, the contract and that test run,
#      which also writes a Code Quality report of what failed. Both reports are uploaded with paths relative to the
#      repository.
# The image must have trace-repro (and the application's test dependencies): override `image` or `before_script` in
# .gitlab-ci.yml (a job of the same name there is merged over this one). Nothing is installed by name here; the
# CI/CD component (templates/trace-repro-gate.yml in trace-repro's repository) installs a wheel pinned by SHA-256.

trace-repro-gate:
  stage: test
  image: python:3.12
  variables:
    TRACE_REPRO_CONTRACT: ""  # default: .trace-repro/contracts/<N>.json
    TRACE_REPRO_TESTS: ""  # default: the test files the merge request adds or changes
    TRACE_REPRO_PYTEST_ARGS: ""
  rules:
    - if: '$CI_PIPELINE_SOURCE == "merge_request_event" && $CI_MERGE_REQUEST_DESCRIPTION =~ /\bProves\s+#\d+\b/i'
  before_script:
    - >-
      command -v trace-repro >/dev/null 2>&1 || { echo "trace-repro is not installed in this image: use one that has
      it, or the CI/CD component (templates/trace-repro-gate.yml), which installs a pinned wheel"; exit 2; }
  script:
    - cd "$CI_PROJECT_DIR" && mkdir -p trace-repro-reports
    - >-
      N="$(printf '%s\n' "$CI_MERGE_REQUEST_DESCRIPTION" | grep -oiE 'proves[[:space:]]+#[0-9]+'
      | sed -n '1s/[^0-9]*//p')" || true
    - >-
      if [ -z "$N" ]; then echo 'the description says no "Proves #N"'; exit 2; fi
    - printf '%s\n' "$CI_MERGE_REQUEST_DESCRIPTION" > trace-repro-reports/description.md
    - base="$CI_MERGE_REQUEST_DIFF_BASE_SHA"; head="${CI_MERGE_REQUEST_SOURCE_BRANCH_SHA:-HEAD}"
    - git cat-file -e "$base^{commit}" 2>/dev/null || git fetch --quiet --depth=1 origin "$base"
    - git diff "$base" "$head" > trace-repro-reports/mr.diff
    - git log --format=%B "$base..$head" > trace-repro-reports/commits.txt
    - >-
      tests="${TRACE_REPRO_TESTS:-$(git diff --name-only --diff-filter=AMR "$base" "$head"
      -- 'test_*.py' '*/test_*.py' '*_test.py' | tr '\n' ' ')}"
    - 'echo "proving issue $N with the tests: ${tests:-none}"'
    - >-
      if [ -f "trace-repro-reports/proof-$N/junit.xml" ]; then
      echo "the tests of issue $N ran in the job trace-repro-proof-$N: the gate judges its report";
      cp "trace-repro-reports/proof-$N/junit.xml" trace-repro-reports/junit.xml;
      elif [ -n "$tests" ]; then
      python -m pytest $tests $TRACE_REPRO_PYTEST_ARGS --junitxml=trace-repro-reports/junit.xml
      || echo "pytest exited with $?: the gate judges its report";
      fi
    - >-
      trace-repro gate --diff trace-repro-reports/mr.diff --description trace-repro-reports/description.md
      --contract "${TRACE_REPRO_CONTRACT:-.trace-repro/contracts/$N.json}" --commits trace-repro-reports/commits.txt
      --junit trace-repro-reports/junit.xml --codequality trace-repro-reports/gl-code-quality-report.json
  artifacts:
    when: always
    expire_in: 30 days
    paths:
      - trace-repro-reports/
    reports:
      junit: trace-repro-reports/junit.xml
      codequality: trace-repro-reports/gl-code-quality-report.json
"""

_TOP_INCLUDE = re.compile(r"^include[ \t]*:(?P<rest>.*)$", re.MULTILINE)


def contract_path(issue_iid: int) -> str:
    """Where the gate job looks for the proof contract of issue ``issue_iid`` (committed with the MR)."""
    return f"{CONTRACTS_DIR}/{issue_iid}.json"


def with_include(ci: str | None, path: str = GATE_JOB_PATH) -> str | None:
    """``ci`` (the CI configuration's text, None when the project has none) including ``path`` (default
    :data:`GATE_JOB_PATH`); ``ci`` itself when it already does, None when its ``include:`` has a form this does not
    edit."""
    entry = f"- local: {path}"
    if ci is None or not ci.strip():
        return f"include:\n  {entry}\n"
    if re.search(rf"local:\s*['\"]?{re.escape(path)}['\"]?\s*$", ci, re.MULTILINE):
        return ci
    found = list(_TOP_INCLUDE.finditer(ci))
    if not found:
        return ci.rstrip("\n") + f"\n\ninclude:\n  {entry}\n"
    if len(found) > 1 or found[0]["rest"].split("#", 1)[0].strip():
        return None  # include: <string or flow list>, or two documents that each include
    after = ci[found[0].end() :].split("\n")[1:]
    for line in after:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        item = re.match(r"^([ \t]+)- ", line)
        if item is None:
            return None  # a map (include: {local: ...}) or an empty include
        at = found[0].end()
        return ci[:at] + f"\n{item[1]}{entry}" + ci[at:]
    return None


__all__ = ["CI_CONFIG_PATH", "CONTRACTS_DIR", "GATE_JOB", "GATE_JOB_PATH", "contract_path", "with_include"]
