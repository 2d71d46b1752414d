"""Untrusted values reach a generated test only as literals: hostile telemetry never becomes code."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processors.model.events import LockMode as Lock
from processors.model.events import SpanKind
from processors.model.outputs import IncidentEvent
from processors.repro import ReproError, compile_repro
from processors.repro.literals import LiteralError, literal_source, plain
from tests.repro.cases import incident

PAYLOADS = (
    '"); import os; os.system("touch {canary}") #',
    "'); import os; os.system('touch {canary}') #",
    "'''; __import__('os').system('touch {canary}'); '''",
    '"""; __import__("os").system("touch {canary}"); """',
    '\n__import__("os").system("touch {canary}")\n',
    "\\'; __import__('os').system('touch {canary}') #\\",
    "{{__import__('os').system('touch {canary}')}}",
    "%s $1 ? %(x)s %% \\x00 \\N{{BULLET}} \u2028 \u0000 \ud800 🧨",
    "'; DROP TABLE orders; --",
    "",
)


def _sql_string(text: str) -> str:
    """``text`` as a SQL string literal inside a psycopg statement."""
    return "'" + text.replace("'", "''").replace("%", "%%") + "'"


def hostile_incident(key: str, value: str, name: str, column: str) -> IncidentEvent:
    """The captured lost update with hostile key, values, names, column and statement text."""
    base = incident("lost_update")
    read = f"SELECT status, version, amount FROM orders WHERE id = %s AND status <> {_sql_string(value)}"
    accesses = []
    for a in base.accesses:
        update: dict[str, object] = {"function": name, "file": name, "route": name, "service": name}
        if a.operation == "read":
            update.update(statement=read, params=[key])
        else:
            update.update(params=[value, key], set_values={"status": value, column: value})
        if a.error:
            update["exception"] = name
        accesses.append(a.model_copy(update=update))
    commits = []
    for c in base.commits:
        images = {
            side: {**(getattr(c, side) or {}), "id": key, "status": value, column: value}
            for side in ("before", "after")
        }
        commits.append(c.model_copy(update=images))
    return base.model_copy(update={"fingerprint": name, "entity": f"orders:{key}", "summary": value, "damage": value,
                                   "accesses": accesses, "commits": commits})  # fmt: skip


def test_literals_round_trip_and_reject_what_is_not_data() -> None:
    """Plain data renders to source that parses back to it; anything else is refused."""
    value = {"a": [1, -2, 2.5, None, True, "x'\"\n\\"], "b": {"c": ""}, 3: [(1, 2)]}
    assert ast.literal_eval(literal_source(value)) == plain(value) == {**value, 3: [[1, 2]]}
    assert literal_source(float("nan")) == "None"
    assert literal_source([Lock.FOR_UPDATE, SpanKind.CLIENT]) == "['for_update', 3]"
    for bad in (object(), {1.5: 1}, b"bytes", {True: 1}):
        with pytest.raises(LiteralError):
            literal_source(bad)


def test_hostile_values_never_become_code(tmp_path: Path) -> None:
    """Hostile keys, values, names, columns and statement text compile to files that parse, import and run (against
    a server that does not exist) without ever running the payload."""
    canary = tmp_path / "pwned"
    payloads = [p.format(canary=canary) for p in PAYLOADS]
    text = st.one_of(st.sampled_from(payloads), st.text(max_size=24))
    keys = text.filter(lambda s: "|" not in s and not re.match(r"[A-Za-z_][A-Za-z0-9_]*=", s))
    sources: list[str] = []

    @settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(key=keys, value=text, name=text, column=text.filter(lambda s: s not in ("id", "status", "amount")))
    def compile_one(key: str, value: str, name: str, column: str) -> None:
        try:
            test = compile_repro(hostile_incident(key, value, name, column))
        except ReproError:
            return  # refusing a statement is a safe outcome; emitting it as code is not
        ast.parse(test.source)
        assert test.name.isascii() and re.fullmatch(r"test_repro_[0-9a-z_]+_sql\.py", test.name)
        sources.append(test.source)

    compile_one()
    assert len(sources) >= 30, "most hostile incidents must still compile"
    folder = tmp_path / "generated"
    folder.mkdir()
    files = []
    for i, source in enumerate(sources):
        files.append(folder / f"test_hostile_{i}.py")
        files[-1].write_text(source, encoding="utf-8")
    env = {**os.environ, "REPRO_DSN": "postgresql://nobody@127.0.0.1:9/none", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    parse = "import ast, sys\nfor f in sys.argv[1:]: ast.parse(open(f, encoding='utf-8').read())"
    load = "\n".join([
        "import importlib.util, sys",
        "for f in sys.argv[1:]:",
        "    spec = importlib.util.spec_from_file_location('m', f)",
        "    spec.loader.exec_module(importlib.util.module_from_spec(spec))",
    ])  # fmt: skip
    for script in (parse, load):
        done = subprocess.run([sys.executable, "-c", script, *map(str, files)], env=env, cwd=folder,
                              capture_output=True, text=True, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull,
                          "--rootdir", str(folder), str(folder)], env=env, cwd=folder, capture_output=True, text=True,
                         check=False)  # fmt: skip
    assert f"{len(files)} failed" in ran.stdout and "OperationalError" in ran.stdout, ran.stdout[-2000:]
    assert not canary.exists()
