"""The evidence packet without a database: its versions, settings and production facts, the incident's accesses and
row changes exactly as recorded, and hostile recorded values that stay data in the generated file (it parses, the
packet round-trips, and nothing of the values runs)."""

from __future__ import annotations

import ast
import json
import platform
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from processors.model.outputs import IncidentEvent
from processors.repro import compile_repro
from processors.repro.evidence import NOT_ON_INCIDENTS, SIDECAR, packet, reduction_record, summary, write_sidecar
from processors.repro.paths import UnsafePath
from processors.repro.schedule import build
from tests.repro.cases import incident

HOSTILE = [
    '"""; import os; os.system("touch /tmp/pwned") #',
    "'); __import__('os').system('id'); ('",
    "\\N{BULLET} \x00 \u202e {__import__('os')} %s %(x)s",
    "EVIDENCE = None\nraise SystemExit(0)",
]


def _hostile(shop: IncidentEvent) -> IncidentEvent:
    """The shop's lost update with hostile text in recorded attributes: a service name, a version, an exception, a
    parameter value (the statement text itself must pass the repro's SQL gate)."""
    accesses = [
        a.model_copy(update={"service": HOSTILE[0], "version": HOSTILE[1], "exception": a.exception or HOSTILE[2]})
        for a in shop.accesses
    ]
    commits = [c.model_copy(update={"span_id": HOSTILE[3]}) for c in shop.commits]
    return shop.model_copy(update={"accesses": accesses, "commits": commits})


def _assigned(source: str) -> dict[str, Any]:
    return {n.target.id: ast.literal_eval(n.value) for n in ast.parse(source).body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.value is not None}  # fmt: skip


def _packet(shop: IncidentEvent) -> dict[str, Any]:
    record = reduction_record(build(shop), enabled=True, removed_steps=[0], shipped="reduced", runs=3)
    settings = {"collisions": {"window_s": 2.0, "skew_ms": 5.0, "invariants": ["stock >= 0"]}}
    return packet(shop, level="sql", settings=settings, server="18.1", reduction=record)


def test_the_packet_names_versions_settings_and_production_and_the_recording_as_it_was() -> None:
    shop = incident("lost_update")
    evidence = _packet(shop)
    assert evidence["python"]["version"] == platform.python_version()
    assert evidence["packages"]["psycopg"] == version("psycopg")
    assert evidence["packages"]["libcst"] == version("libcst")
    assert evidence["trace_repro"] == version("trace-repro")
    assert evidence["postgresql"] == {"repro_server": "18.1", "production": None}
    assert evidence["settings"]["collisions"] == {"window_s": 2.0, "skew_ms": 5.0, "invariants": ["stock >= 0"]}
    traces = {(t["trace_id"], t["service"], t["version"]) for t in evidence["production"]["traces"]}
    assert traces == {(a.trace_id, a.service, a.version) for a in shop.accesses}
    assert evidence["production"]["not_on_incidents"] == list(NOT_ON_INCIDENTS)
    recorded = evidence["recorded"]
    assert recorded["accesses"] == [a.model_dump(mode="json") for a in shop.accesses]
    assert recorded["commits"] == [c.model_dump(mode="json") for c in shop.commits]
    first = build(shop).steps[0]
    assert evidence["reduction"]["removed_steps"] == [
        {"session": first.session, "kind": first.kind, "statement": first.statement, "params": first.params}
    ]
    assert "recorded" not in summary(evidence) and summary(evidence)["reduction"] == evidence["reduction"]
    assert "dsn" not in json.dumps(evidence).lower()


def test_hostile_recorded_values_stay_data_in_the_generated_file(tmp_path: Path) -> None:
    """The file parses, ``EVIDENCE`` is one literal equal to the packet (every hostile value back as it was), and
    the values occur only inside string constants: no call, import or assignment they could have made exists."""
    shop = _hostile(incident("lost_update"))
    evidence = _packet(shop)
    test = compile_repro(shop, evidence=evidence)
    tree = ast.parse(test.source)
    data = _assigned(test.source)
    assert data["EVIDENCE"] == evidence
    dumped = json.dumps(data["EVIDENCE"])
    for value in HOSTILE:
        assert json.dumps(value)[1:-1] in dumped
    last = tree.body[-1]
    assert isinstance(last, ast.AnnAssign) and isinstance(last.target, ast.Name) and last.target.id == "EVIDENCE"
    assert [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "EVIDENCE"] == [last.target]
    assert "__import__" not in {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert not any(isinstance(n, ast.Raise) and "SystemExit" in ast.unparse(n) for n in ast.walk(tree))
    calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert "os.system" not in calls and "__import__" not in calls
    sidecar = write_sidecar(tmp_path, tmp_path / "repros" / "x", evidence)
    assert sidecar == (tmp_path / "repros" / "x" / SIDECAR).resolve()
    assert json.loads(sidecar.read_text(encoding="utf-8")) == evidence


def test_a_sidecar_outside_the_output_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out" / "repros").mkdir(parents=True)
    (tmp_path / "out" / "repros" / "x").symlink_to(tmp_path)
    with pytest.raises(UnsafePath):
        write_sidecar(tmp_path / "out", tmp_path / "out" / "repros" / "x", {"a": 1})
    assert not (tmp_path / SIDECAR).exists()
