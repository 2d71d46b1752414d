"""The recorded ORM statements are still what the stacks send: the recorder run again on the real PostgreSQL."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "fixtures" / "orm_statements.json"
_DJANGO_SAVEPOINT = re.compile(r'"s\d+_x(\d+)"')  # Django names a savepoint after its thread id and a counter


def _statements(records: list[dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    out = []
    for r in records:
        text = r["attributes"].get("db.statement", "")
        text = text["bytes"] if isinstance(text, dict) else text
        out.append((r["stack"], r["step"], r["name"], _DJANGO_SAVEPOINT.sub(r'"s_x\1"', text)))
    return out


def test_the_fixture_is_what_the_stacks_send(postgres_dsn: str, tmp_path: Path) -> None:
    """Every stack's statements, span names and attribute keys, recorded now, equal the committed fixture (in a
    subprocess: the instrumentors patch the drivers for the whole process)."""
    out = tmp_path / "orm_statements.json"
    # The stacks' default conventions: not the stable ones the corpus's telemetry opts this process into
    env = {k: v for k, v in os.environ.items() if k != "OTEL_SEMCONV_STABILITY_OPT_IN"}
    subprocess.run([sys.executable, "-m", "tests.orm_recorder", postgres_dsn, str(out)], cwd=ROOT, check=True,
                   timeout=300, capture_output=True, env=env)  # fmt: skip
    recorded, committed = json.loads(out.read_text()), json.loads(FIXTURE.read_text())
    assert _statements(recorded) == _statements(committed)
    assert [sorted(r["attributes"]) for r in recorded] == [sorted(r["attributes"]) for r in committed]
