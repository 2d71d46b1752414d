"""Just enough of a Dockerfile and .dockerignore reader for the tests: stages, instructions, and what the build
context holds (Docker cannot run on these machines)."""

from __future__ import annotations

import fnmatch
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)


def stages(text: str) -> list[Stage]:
    """The build stages in order, each with its instructions (continuation lines joined, comments dropped)."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    found: list[Stage] = []
    for line in lines:
        op, _, rest = line.partition(" ")
        op = op.upper()
        if op == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(found))
            found.append(Stage(name, words[0]))
        elif found:
            found[-1].instructions.append((op, rest.strip()))
    return found


def chain(all_stages: list[Stage], target: str | None = None) -> list[Stage]:
    """The stages a target is built from, base first (default target: the last stage)."""
    by_name = {s.name: s for s in all_stages}
    stage = by_name[target] if target else all_stages[-1]
    out = [stage]
    while stage.base in by_name:
        stage = by_name[stage.base]
        out.insert(0, stage)
    return out


def last(target: list[Stage], op: str) -> str | None:
    values = [rest for s in target for o, rest in s.instructions if o == op]
    return values[-1] if values else None


def exec_form(value: str) -> list[str]:
    """An instruction's JSON (exec) form, e.g. ENTRYPOINT ["trace-repro"]."""
    parsed = json.loads(value)
    assert isinstance(parsed, list)
    return [str(v) for v in parsed]


def key_values(target: list[Stage], instruction: str) -> dict[str, str]:
    """The ``key=value`` words of every ``instruction`` (ENV, LABEL) of ``target``'s stages, later ones winning."""
    out: dict[str, str] = {}
    for s in target:
        for op, rest in s.instructions:
            if op == instruction:
                for word in shlex.split(rest):
                    key, _, value = word.partition("=")
                    out[key] = value
    return out


def env(target: list[Stage]) -> dict[str, str]:
    return key_values(target, "ENV")


def labels(target: list[Stage]) -> dict[str, str]:
    return key_values(target, "LABEL")


def included(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore's ``patterns`` keep ``path`` (relative, '/'-separated) in the build context: the last
    pattern matching the path or one of its parent directories decides; ``!`` keeps."""
    keep = True
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw.lstrip("!").rstrip("/")
        anywhere = pattern.removeprefix("**/")
        for prefix in prefixes:
            tail = prefix.rsplit("/", 1)[-1]
            if fnmatch.fnmatchcase(prefix, pattern) or (
                pattern.startswith("**/") and fnmatch.fnmatchcase(tail, anywhere)
            ):
                keep = negate
                break
    return keep


def ignore_patterns(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
