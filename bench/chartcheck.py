"""The Helm chart's checker: ``deploy/helm/check``, a small Go program on Helm's and Kubernetes' own packages.

It renders ``deploy/helm/trace-repro`` as ``helm template`` does (``helm.sh/helm/v3`` install, client only, dry
run), runs ``helm lint``'s rules, and decodes every manifest strictly into the Kubernetes API types and the
prometheus-operator types: "the manifests validate" means the real API types accept them, unknown fields included.
Compiled once per source digest and cached like the test Collector (:class:`bench.collector.build.GoProgram`).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.collector.build import GoProgram

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "deploy" / "helm" / "trace-repro"
CHECKER = GoProgram("chartcheck", REPO / "deploy" / "helm" / "check", "helm-3.21.4", "the Helm chart checker")


@dataclass(frozen=True, slots=True)
class Rendered:
    """What the checker said: its exit status, the lint messages, the decoded manifests, and its stderr."""

    returncode: int
    lint: list[dict[str, str]]
    manifests: list[dict[str, Any]]
    errors: str

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [m["object"] for m in self.manifests if m["kind"] == kind]


def render(binary: Path, *values: Path, chart: Path = CHART) -> Rendered:
    """Render ``chart`` with ``values`` files (later ones win) and decode every manifest (see the module docstring)."""
    argv = [str(binary), *(arg for v in values for arg in ("-f", str(v))), str(chart)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    report: dict[str, Any] = json.loads(done.stdout) if done.stdout.strip() else {"lint": [], "manifests": []}
    return Rendered(done.returncode, report["lint"], report["manifests"], done.stderr)
