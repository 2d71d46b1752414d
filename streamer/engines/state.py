"""The state of one ``local up``: each engine's PID, ports and directories, kept in ``state.json``."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(slots=True)
class EngineState:
    """What is needed to reach, probe, restart and stop one running engine."""

    name: str
    pid: int
    port: int
    data_dir: str
    log: str
    extra: dict[str, Any] = field(default_factory=dict)


def load(path: Path) -> dict[str, EngineState]:
    if not path.exists():
        return {}
    raw = json.loads(path.read_text())
    return {name: EngineState(**fields) for name, fields in raw.get("engines", {}).items()}


def save(path: Path, engines: dict[str, EngineState]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"engines": {n: asdict(s) for n, s in engines.items()}}, indent=2))
    tmp.replace(path)
