"""Which GREEN run ``run_repro`` re-runs: the one the repro worker left last, of the full repro or the reduced one."""

from __future__ import annotations

import os
from pathlib import Path

from streamer.mcp.tools_findings import _green_of

FP = "fa11ed0000000001"


def _run(base: Path, at: float) -> tuple[Path, Path]:
    test = base / "green" / f"test_repro_{FP}_app.py"
    test.parent.mkdir(parents=True)
    test.write_text("def test_x(): pass\n", encoding="utf-8")
    copy = base / "repro-green-abc"
    copy.mkdir()
    for path in (test, copy):
        os.utime(path, (at, at))
    return test, copy


def test_the_reduced_repros_green_run_is_found_beside_the_full_ones(tmp_path: Path) -> None:
    """The worker runs GREEN on what it ships: the reduced repro's (``work/<fp>/reduced/``) when it holds, else the
    full one's (``work/<fp>/``), the later of the two; nothing at all is None."""
    work = tmp_path / "work" / FP
    assert _green_of(str(tmp_path), FP) is None
    reduced = _run(work / "reduced", 1_000.0)
    assert _green_of(str(tmp_path), FP) == (reduced[0], str(reduced[1]))
    full = _run(work, 2_000.0)  # the reduced one's GREEN failed, so the full one was proven after it
    assert _green_of(str(tmp_path), FP) == (full[0], str(full[1]))
