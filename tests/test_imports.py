"""What the daemon loads: a component's heavy dependencies only when the component is enabled (resident memory)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import processors.repro
import sinks.gitlab
from processors.api.lazy import exports
from processors.connectors.repro import ReproWorker

HEAVY = ("libcst", "psycopg", "gitlab", "requests", "scipy", "numpy")


def _loaded(*modules: str) -> list[str]:
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    loaded: list[str] = json.loads(out)
    return loaded


def test_the_daemon_and_its_cli_load_no_component_dependency_and_no_scipy() -> None:
    """The repro worker's libcst (and its psycopg templates), the GitLab sink's python-gitlab and requests, and scipy
    (the first statistical test imports it) are loaded by what uses them, not by `trace-repro run` starting."""
    assert _loaded("streamer.cli", "streamer.runtime.app", "streamer.components", "streamer.config") == []


def test_building_an_enabled_component_loads_what_it_needs() -> None:
    assert "libcst" in _loaded("processors.connectors.repro.worker")
    assert {"gitlab", "requests"} <= set(_loaded("sinks.gitlab.sink"))


def test_lazy_exports_are_the_modules_own_objects() -> None:
    from processors.connectors.repro.worker import ReproWorker as Worker
    from processors.repro.compiler import compile_repro
    from sinks.gitlab.sink import GitLabSink

    assert ReproWorker is Worker
    assert processors.repro.compile_repro is compile_repro
    assert sinks.gitlab.GitLabSink is GitLabSink
    for package in (processors.repro, sinks.gitlab):
        for name in package.__all__:
            assert getattr(package, name) is not None, name


def test_an_unknown_name_is_an_attribute_error() -> None:
    getattr_ = exports("processors.repro", {"processors.repro.compiler": ("compile_repro",)})
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        getattr_("nope")
    with pytest.raises(AttributeError):
        sinks.gitlab.nope  # type: ignore[attr-defined]  # noqa: B018


def test_the_statistical_tests_a_daemon_runs_do_not_load_scipy_stats() -> None:
    """The regression detector and the proof judge test with scipy.special (41 MB with numpy), not scipy.stats (87)."""
    code = (
        "import sys\n"
        "from processors.lib.stat_tests import conditional_binomial, mann_whitney, rate_interval\n"
        "from processors.connectors.proofs.verdicts import requests_for_share\n"
        "conditional_binomial(3, 100, 9, 100, 'greater'); rate_interval(2, 50)\n"
        "requests_for_share(40, 1000, 0.01, 0.05)\n"
        "mann_whitney([1.0, 2.0, 3.0], [2.5, 4.0]); mann_whitney(list(range(30)), [x / 2 for x in range(40)])\n"
        "assert 'scipy.special' in sys.modules, 'the tests did not run'\n"
        "print(sorted(m for m in sys.modules if m == 'scipy.stats' or m.startswith('scipy.stats.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert json.loads(out.replace("'", '"')) == []
