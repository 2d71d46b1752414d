"""The Collector binary is built once per source digest, under a file lock, and reused (with a stand-in ``go``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.collector import build

FAKE_GO = """#!/bin/sh
if [ "$1" = env ]; then echo go1.99.0; exit 0; fi
echo "$$" >> "$FAKE_GO_RUNS"
sleep 1
while [ $# -gt 0 ]; do
  if [ "$1" = -o ]; then printf '#!/bin/sh\\n' > "$2"; fi
  shift
done
"""


def test_two_processes_build_once_and_both_get_the_binary(tmp_path: Path) -> None:
    """Two test processes ask for the binary at once: one builds (``go build -trimpath``), the other waits on the
    lock and reuses it; a later call finds it in the cache without building."""
    go = tmp_path / "go"
    go.write_text(FAKE_GO)
    go.chmod(0o755)
    runs = tmp_path / "runs"
    env = {
        **os.environ,
        "TRACE_REPRO_GO": str(go),
        "TRACE_REPRO_CACHE": str(tmp_path / "cache"),
        "FAKE_GO_RUNS": str(runs),
    }
    ask = [sys.executable, "-c", "from bench.collector import build; print(build.binary())"]
    procs = [subprocess.Popen(ask, env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    paths = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert paths == {str(build.cached_path(tmp_path / "cache"))}
    assert len(runs.read_text().splitlines()) == 1
    assert build.binary(tmp_path / "cache") == Path(paths.pop())
    assert len(runs.read_text().splitlines()) == 1
    log = (tmp_path / "cache").glob("otelcol-*/build.log")
    assert "build -trimpath" in next(log).read_text()
