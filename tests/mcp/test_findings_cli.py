"""``trace-repro findings list|show`` on the known graph in the real FalkorDB: table and JSON output, exit statuses."""

from __future__ import annotations

import asyncio
import json

import pytest

from streamer import cli
from tests.mcp.known_graph import FP, KnownGraph


async def findings(known_graph: KnownGraph, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                   *args: str) -> tuple[int, str, str]:  # fmt: skip
    """Run ``trace-repro findings ARGS`` against the known graph (in a thread: the command runs its own loop)."""
    for name, value in known_graph.env().items():
        if name.startswith("TRACE_REPRO_"):
            monkeypatch.setenv(name, value)
    status = await asyncio.to_thread(cli.main, ["findings", *args])
    out, err = capsys.readouterr()
    return status, out, err


async def test_list_shows_a_table_and_the_same_as_json(
    known_graph: KnownGraph, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``list`` prints one row per finding under a header (fingerprint, class, state, services, summary); ``--json``
    prints the MCP tool's JSON; filters apply."""
    status, out, _ = await findings(known_graph, monkeypatch, capsys, "list", "--service", "checkout")
    assert status == 0
    header, row = out.splitlines()
    assert header.split()[:5] == ["FINGERPRINT", "ANOMALY", "SEVERITY", "STATE", "OCC"]
    assert row.startswith(f"{FP}  lost_update") and " fixed " in row and "checkout" in row
    status, out, _ = await findings(known_graph, monkeypatch, capsys, "list", "--json")
    listed = json.loads(out)
    assert status == 0 and [i["fingerprint"] for i in listed["items"]] == [FP] and listed["truncated"] is False
    status, out, _ = await findings(known_graph, monkeypatch, capsys, "list", "--state", "open")
    assert (status, out) == (0, "no findings\n")


async def test_show_prints_the_evidence_and_an_unknown_fingerprint_exits_1(
    known_graph: KnownGraph, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``show`` prints the parties with their full trace ids, the timeline, the repro and the verdicts; ``--json`` the
    MCP tool's JSON; an unknown fingerprint is exit status 1 with a message on stderr."""
    status, out, _ = await findings(known_graph, monkeypatch, capsys, "show", FP)
    assert status == 0
    assert out.startswith(f"{FP}  lost_update")
    culprit = next(line for line in out.splitlines() if line.strip().startswith("culprit"))
    assert len(culprit.split("trace ")[1].split()[0]) == 32  # the whole trace id, to paste into a trace UI
    assert "repro: " in out and "proven" in out and "FIXED @ 2.0" in out
    status, out, _ = await findings(known_graph, monkeypatch, capsys, "show", FP, "--json")
    assert status == 0 and json.loads(out)["parties"][0]["role"] == "culprit"
    status, out, err = await findings(known_graph, monkeypatch, capsys, "show", "ffffffffffffffff")
    assert (status, out) == (1, "") and "no incident with fingerprint 'ffffffffffffffff'" in err


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    """``trace-repro --version`` prints the package's version and exits 0."""
    from streamer.version import __version__

    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"trace-repro {__version__}\n"
