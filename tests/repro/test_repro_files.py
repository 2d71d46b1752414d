"""The repro files for CI: the test, a JUnit XML of its runs, and a GitLab Code Quality report."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from processors.model.outputs import RunInfo
from processors.repro import compile_repro
from processors.repro.ci_files import code_quality, junit_xml, write_repro_files
from tests.repro.cases import REPO, incident

RED = RunInfo(status="failed", failure="t.DefectReproduced: lost update on orders:1000\x00\x1b[31m", duration_ms=612.5)
GREEN = RunInfo(status="passed", failure="", duration_ms=480.0)


def test_the_three_files_are_written_under_the_fingerprint(tmp_path: Path) -> None:
    """``out/repros/<fingerprint>/`` holds the test, the JUnit XML and the Code Quality report."""
    event = incident("lost_update")
    test = compile_repro(event)
    files = write_repro_files(tmp_path / "out", event, test, {"red": RED, "green": GREEN}, repo_root=REPO)
    assert files.directory == tmp_path / "out" / "repros" / "b98839ad1b70ae75"
    assert files.test.read_text(encoding="utf-8") == test.source
    assert sorted(p.name for p in files.directory.iterdir()) == sorted(
        [test.name, "junit.xml", "gl-code-quality-report.json"])  # fmt: skip


def test_junit_reports_red_as_a_failure_and_green_as_a_pass() -> None:
    """One testcase per run; the failure text survives (control characters replaced) in valid XML."""
    test = compile_repro(incident("lost_update"))
    suite = ET.fromstring(junit_xml(test, {"red": RED, "green": GREEN}).split("\n", 1)[1]).find("testsuite")
    assert suite is not None and (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("2", "1", "0")
    red, green = suite.findall("testcase")
    failure = red.find("failure")
    assert failure is not None and "lost update on orders:1000" in failure.get("message", "")
    assert (red.get("name"), red.get("time"), green.find("failure")) == ("red", "0.613", None)


def _line(text: str) -> int:
    """The (1-based) line of the shop's handlers that holds ``text`` (exactly one does)."""
    lines = (REPO / "bench" / "shop" / "handlers.py").read_text(encoding="utf-8").splitlines()
    [number] = [n for n, line in enumerate(lines, 1) if text in line]
    return number


def test_code_quality_lists_each_unprotected_writer_at_its_statement() -> None:
    """Both writers of the lost update, at the lines of their UPDATEs (or ``def``), paths relative to the repo."""
    issues = code_quality(incident("lost_update"), REPO)
    assert [(i["location"]["path"], i["location"]["lines"]["begin"]) for i in issues] == [
        ("bench/shop/jobs.py", 13), ("bench/shop/handlers.py", _line('cur.execute(SET_STATUS, ("paid"'))]  # fmt: skip
    assert all(i["severity"] == "critical" and i["check_name"] == "trace-repro/lost_update" for i in issues)
    assert len({i["fingerprint"] for i in issues}) == 2
    assert "shop.jobs.expire_cart writes without a lock or guard: UPDATE orders" in issues[0]["description"]
    double = code_quality(incident("duplicate_apply"), REPO)
    assert [(i["location"]["path"], i["location"]["lines"]["begin"]) for i in double] == [
        ("bench/shop/handlers.py", _line('cur.execute("INSERT INTO charges (order_id, amount) VALUES'))]  # fmt: skip
    json.dumps(issues)


def test_code_quality_points_at_the_check_then_write_and_at_a_skewed_reader() -> None:
    """A write skew flags each doctor's UPDATE; a read skew flags the audit's reads, not the transfer that did
    nothing wrong; the captured phantom flags the charge's INSERT."""
    from tests.repro.anomalies import CASES

    skew = code_quality(CASES["write_skew"](), REPO)
    assert [i["location"]["path"] for i in skew] == ["tests/repair/clinic/oncall.py"]
    assert "clinic.oncall.go_off_call writes without a lock or guard: UPDATE doctors" in skew[0]["description"]
    reads = code_quality(CASES["read_skew"](), REPO)
    assert [(i["location"]["path"], i["check_name"]) for i in reads] == [
        ("tests/repair/clinic/ledger.py", "trace-repro/read_skew")]  # fmt: skip
    assert "clinic.ledger.audit reads it in separate statements, unlocked: SELECT balance" in reads[0]["description"]
    phantom = code_quality(incident("phantom"), REPO)
    assert [(i["location"]["path"], i["location"]["lines"]["begin"]) for i in phantom] == [
        ("bench/shop/handlers.py", _line('cur.execute("INSERT INTO charges (order_id, amount) VALUES'))]  # fmt: skip


def test_a_hostile_fingerprint_cannot_leave_the_output_directory(tmp_path: Path) -> None:
    """A fingerprint that is not a plain name is hashed into one."""
    event = incident("duplicate_apply").model_copy(update={"fingerprint": "../../../etc/x"})
    files = write_repro_files(tmp_path, event, compile_repro(event), {})
    assert files.directory.parent == tmp_path / "repros" and files.directory.name.isalnum()
