"""The merge-request gate as a GitLab CI/CD component (templates/trace-repro-gate.yml): its inputs, that everything
it installs is pinned (the wheel by SHA-256, pydantic by exact version) and is all the gate needs, and that its job
is the local template's (config/gitlab-ci/trace-repro-gate.yml) but for installing and invoking the gate."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPONENT = ROOT / "templates" / "trace-repro-gate.yml"
LOCAL = ROOT / "config" / "gitlab-ci" / "trace-repro-gate.yml"
JOB = "trace-repro-gate"
INPUT = re.compile(r"\$\[\[\s*inputs\.(\w+)\s*\]\]")
GATE_NEEDS = {"pydantic", "pydantic_core", "annotated_types", "typing_extensions", "typing_inspection"}


def documents() -> tuple[dict[str, Any], dict[str, Any]]:
    header, body = yaml.safe_load_all(COMPONENT.read_text())
    return header, body


def job() -> dict[str, Any]:
    spec = documents()[1][JOB]
    assert isinstance(spec, dict)
    return spec


def test_a_component_header_declares_the_inputs() -> None:
    """Two YAML documents: `spec: inputs:`, then one job. The wheel and its SHA-256 have no default (the user names
    the artifact); every input used is declared and every declared input is used."""
    header, body = documents()
    inputs = header["spec"]["inputs"]
    assert list(header) == ["spec"] and list(body) == [JOB]
    required = {name for name, spec in inputs.items() if "default" not in spec}
    assert required == {"wheel_url", "wheel_sha256"}
    text = COMPONENT.read_text().split("\n---\n", 1)[1]
    assert set(INPUT.findall(text)) == set(inputs)
    assert re.fullmatch(inputs["wheel_sha256"]["regex"], "0" * 64)
    assert not re.fullmatch(inputs["wheel_sha256"]["regex"], "latest")
    assert re.fullmatch(inputs["pydantic_version"]["regex"], inputs["pydantic_version"]["default"])


def test_everything_installed_is_pinned() -> None:
    """Each pip install is either the wheel from a hash-checked requirements file (--require-hashes, --no-deps) or
    an exact version (==); nothing is installed by a bare name someone else could register."""
    lines = [line for line in job()["before_script"] if "pip install" in line]
    assert len(lines) == 2
    wheel, pydantic = lines
    assert {"--require-hashes", "--no-deps", "-r"} <= set(shlex.split(wheel))
    written = next(line for line in job()["before_script"] if "/tmp/trace-repro-gate.txt" in line and "printf" in line)
    assert "trace-repro @ %s --hash=sha256:%s" in written
    (requirement,) = [w for w in shlex.split(pydantic) if w.startswith("pydantic")]
    assert re.fullmatch(r"pydantic==\$\[\[ inputs\.pydantic_version \]\]", requirement)
    assert "TRACE_REPRO_PACKAGE" not in COMPONENT.read_text() and "TRACE_REPRO_PACKAGE" not in LOCAL.read_text()


def test_the_local_template_installs_nothing_by_name() -> None:
    """The file trace-repro's merge requests commit installs nothing: without trace-repro in the image it stops
    and names the component."""
    local = yaml.safe_load(LOCAL.read_text())[JOB]
    assert not any("pip" in line for line in local["before_script"])
    assert "templates/trace-repro-gate.yml" in local["before_script"][0]


def test_the_gate_needs_only_pydantic() -> None:
    """`python -m streamer.gate` imports no third-party package but pydantic and its own dependencies: the wheel
    without its dependencies plus pydantic is enough."""
    probe = (
        "import sys, streamer.gate; "
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names))))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    loaded = {m for m in done.stdout.split() if not m.startswith("_")}
    third_party = loaded - {"streamer", "processors", "sinks"}
    assert third_party <= GATE_NEEDS


def test_the_job_is_the_local_templates_but_for_the_gate_itself() -> None:
    """Rules, script and artifacts are the local template's line for line, but for the last script line, which runs
    the installed wheel's gate (same arguments) instead of a `trace-repro` on PATH."""
    component, local = job(), yaml.safe_load(LOCAL.read_text())[JOB]
    assert component["rules"] == local["rules"] and component["artifacts"] == local["artifacts"]
    assert component["script"][:-1] == local["script"][:-1]
    ours = component["script"][-1].split(" ", 3)
    assert ours[:3] == ["/tmp/trace-repro-gate/bin/python", "-m", "streamer.gate"]
    assert ours[3] == local["script"][-1].removeprefix("trace-repro gate ")
    assert set(component["variables"]) == set(local["variables"])
