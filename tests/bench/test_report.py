"""The bench's report: ratios to the floor, targets and correctness checks are arithmetic on one run's figures."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from bench.latency import as_planted, row_key
from bench.run import checks, ratios, report, summary, targets


def _phase(spans_per_s: float, **extra: Any) -> dict[str, Any]:
    return {"spans": 300_000, "seconds": 300_000 / spans_per_s, "spans_per_s": spans_per_s, **extra}


def _results(*, e2e: float = 60_000.0, traces: int = 1_000, incidents_ok: bool = True) -> dict[str, Any]:
    phases = {
        "generate": _phase(40_000.0),
        "parse": _phase(1_000_000.0, protobuf="upb"),
        "walk": _phase(400_000.0),
        "decode": _phase(200_000.0),
        "stage": _phase(100_000.0, detailed_traces=1_000, internal_produced=10, graph_rows={"spans": 60_000}),
        "falkordb_write": _phase(80_000.0, rows=60_000, rows_per_s=16_000.0, client_cpu_share=0.5, cpu_cores={},
                                 traces=1_000, expected_traces=1_000),
        "kafka_produce": _phase(500_000.0, mb_per_s=50.0, messages_per_s=1_000.0),
        "kafka_consume": _phase(900_000.0, mb_per_s=90.0),
        "end_to_end": _phase(e2e, cpu_cores={"daemon": 1.9}, traces=traces, expected_traces=1_000,
                             cli_workers="default", daemon_processes=3, startup_s=2.0, consumed_s=4.0,
                             consumed_spans_per_s=75_000.0, daemon_metrics={},
                             daemon_peak_rss_mb_per_process=[120.0, 100.0, 50.0], daemon_peak_sampled_pss_mb=180.0),
    }  # fmt: skip
    table = {"planted": 2, "found": 2 if incidents_ok else 1, "latent": 0,
             "missed": [] if incidents_ok else ["7"], "unexpected": []}  # fmt: skip
    results: dict[str, Any] = {
        "config": {"spans": 300_000, "traces": 30_000, "db_spans": 30_000, "error_traces": 300, "messages": 1_000,
                   "spans_per_message": 300, "bytes": 10 << 20, "partitions": 2, "cpus": 2},
        "phases": phases,
        "rss": {"bench_peak_mb": 500.0, "daemon_peak_mb": 270.0},
        "detection_latency": {"tuned": {"floor_s": 2.5, "latency_p99_s": 2.9, "latency_min_s": 2.1,
                                        "as_planted": {"ok": incidents_ok, "tables": {"orders": table}}}},
    }  # fmt: skip
    results["ratio"] = ratios(phases)
    results["targets"] = targets(results)
    results["checks"] = checks(results)
    return results


def test_every_phase_is_a_ratio_to_the_parse_walk_floor() -> None:
    """Each phase's spans/s over the floor's; the floor is 1; end to end also over the slowest ceiling."""
    r = _results()["ratio"]
    assert r["floor"] == "walk" and r["floor_spans_per_s"] == 400_000.0
    assert r["over_floor"]["walk"] == 1.0
    assert r["over_floor"]["parse"] == pytest.approx(2.5)
    assert r["over_floor"]["end_to_end"] == pytest.approx(0.15)
    assert set(r["over_floor"]) >= {"parse", "decode", "stage", "falkordb_write", "kafka_consume", "end_to_end"}
    assert r["slowest"] == "falkordb_write" and r["slowest_spans_per_s"] == 80_000.0
    assert r["end_to_end_over_slowest"] == pytest.approx(0.75)


def test_without_the_daemon_end_to_end_has_no_ratio() -> None:
    """No end-to-end phase: no end-to-end ratios, and its targets are not measured rather than failed."""
    results = _results()
    del results["phases"]["end_to_end"], results["rss"]["daemon_peak_mb"], results["detection_latency"]
    results["ratio"] = ratios(results["phases"])
    assert results["ratio"]["end_to_end_over_slowest"] is None and "end_to_end" not in results["ratio"]["over_floor"]
    met = {t["name"]: t["met"] for t in targets(results)}
    assert met["end to end / parse+walk floor"] is None and met["detection latency p99 (s)"] is None


def test_targets_are_judged_on_the_ratios() -> None:
    """0.15 of the floor and 0.6 of the slowest ceiling are met at the boundary; latency gets floor + 0.5 s."""
    met = {t["name"]: t["met"] for t in _results()["targets"]}
    assert met == {
        "end to end / parse+walk floor": True,  # 60k / 400k = 0.15
        "end to end / slowest ceiling": True,  # 60k / 80k = 0.75
        "detection latency p99 (s)": True,  # 2.9 <= 2.5 + 0.5
        "daemon peak RSS (MB)": True,  # 270 <= 300
        "graph rows per span": True,  # 60k / 300k = 0.2
        "daemon CPU/span / peer A": None,  # no peer in this run (bench.peer's own tests judge it)
        "daemon CPU/span / peer B": None,
    }
    slow = {t["name"]: t for t in _results(e2e=50_000.0)["targets"]}
    assert slow["end to end / parse+walk floor"]["met"] is False
    assert slow["end to end / parse+walk floor"]["value"] == pytest.approx(0.125)
    assert slow["end to end / slowest ceiling"]["met"] is True  # 50k / 80k = 0.625
    latency = slow["detection latency p99 (s)"]
    assert latency["limit"] == pytest.approx(3.0) and latency["at_most"]


def test_graph_rows_per_span_is_the_stage_batches_rows_over_spans() -> None:
    """Every GraphBatch row the stage-only phase produced, over its spans."""
    rows = next(t for t in _results()["targets"] if t["name"] == "graph rows per span")
    assert rows["value"] == pytest.approx(0.2) and rows["met"] is True


def test_a_changed_result_fails_the_checks() -> None:
    """A trace count that differs from the stage-only phase, or a missed planted incident, is a failed check."""
    assert all(c["ok"] for c in _results()["checks"])
    bad = _results(traces=999, incidents_ok=False)
    failed = [c["check"] for c in bad["checks"] if not c["ok"]]
    assert len(failed) == 2 and failed[0].startswith("end_to_end") and "planted" in failed[1]
    assert "FAILED" in summary(bad)


def test_the_report_shows_the_floor_and_every_ratio() -> None:
    """The table names the floor and prints each phase's ratio; the summary prints each target met or not."""
    results = _results()
    text = report(results)
    assert "parse + walk = THE FLOOR" in text and "1.000" in text
    assert "0.150" in text  # end to end / floor
    assert "end to end / slowest ceiling = 0.750" in text
    assert "daemon 270 MB (VmHWM summed over 3 process(es)); PSS summed at its peak sample 180 MB" in text
    lines = summary(results).splitlines()
    assert sum(1 for line in lines if line.rstrip().endswith(("met", "NOT met")) or " met   (" in line) == 5
    assert lines[-1].startswith("SUMMARY: 5/7 targets met")  # the peer's two: not measured


def test_incidents_must_be_the_planted_rows() -> None:
    """A manifest incident on each planted row and nowhere else; latent ones only on raced rows."""
    incidents = [
        {"kind": "incident", "table": "public.orders", "entity": "orders:7", "manifest": True},
        {"kind": "incident", "table": "charges", "entity": "charges:order_id=9", "manifest": True},
        {"kind": "incident", "table": "orders", "entity": "orders:8", "manifest": False},
    ]
    planted, raced = {"orders": {"7"}, "charges": {"9"}}, {"orders": {"7", "8"}, "charges": {"9"}}
    assert row_key("charges:order_id=9") == "9" and row_key("inventory:sku-1") == "sku-1"
    assert as_planted(incidents, planted, raced)["ok"]
    missed = as_planted(incidents[1:], planted, raced)
    assert not missed["ok"] and missed["tables"]["orders"]["missed"] == ["7"]
    elsewhere = as_planted([*incidents, {"table": "orders", "entity": "orders:99", "manifest": False}], planted, raced)
    assert not elsewhere["ok"] and elsewhere["tables"]["orders"]["unexpected"] == ["99"]


def test_the_written_span_nodes_are_checked_and_reported_beside_the_rows() -> None:
    """The write phase's Span nodes must be the kept spans of the stage's rows; the rows target names their share."""
    results = _results()
    results["phases"]["stage"]["span_nodes"] = 150_000
    results["phases"]["falkordb_write"] |= {"span_nodes": 150_000, "expected_span_nodes": 150_000}
    check = next(c for c in checks(results) if "Span nodes" in c["check"])
    assert check["ok"] and check["detail"] == "150,000 vs 150,000"
    results["phases"]["falkordb_write"]["span_nodes"] = 149_999
    assert not next(c for c in checks(results) if "Span nodes" in c["check"])["ok"]
    rows = next(t for t in targets(results) if t["name"] == "graph rows per span")
    assert rows["note"].endswith("0.50 Span nodes/span")


def test_a_phase_that_stalls_prints_every_threads_stack(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                        capfd: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """The report goes to standard error, here a file of the test's: read back whole, never truncated while the
    report's own thread may still be writing it (as a capture's reads are), until the waiting thread's stack is in."""
    import faulthandler
    import time

    import bench.run

    monkeypatch.setattr(bench.run, "STALL_S", 0.2)
    report = tmp_path / "stderr"
    text = ""
    with report.open("w") as stderr:
        monkeypatch.setattr(sys, "stderr", stderr)
        try:
            bench.run.phase("a phase that waits")
            deadline = time.monotonic() + 30  # its own thread writes it: wait for it, however busy the machine
            while "test_a_phase_that_stalls" not in text and time.monotonic() < deadline:
                time.sleep(0.05)
                text = report.read_text()
        finally:
            faulthandler.cancel_dump_traceback_later()
    assert "== a phase that waits" in capfd.readouterr().out
    assert "Thread" in text
    assert "test_a_phase_that_stalls_prints_every_threads_stack" in text  # the stack of the waiting thread


def test_the_collector_shaped_run_is_checked_and_reported_as_its_own_rows() -> None:
    """``--message-shape both``: the one-trace-per-message run must put the same traces in its graph."""
    results = _results()
    p = results["phases"]
    p["kafka_produce_collector"] = _phase(100_000.0, messages=280_000, mb_per_s=20.0)
    p["end_to_end_collector"] = p["end_to_end"] | {
        "spans_per_s": 20_000.0,
        "seconds": 15.0,
        "traces": 999,
        "daemon_peak_rss_mb": 410.0,
    }
    results["ratio"] = ratios(p)
    check = next(c for c in checks(results) if c["check"].startswith("end_to_end_collector"))
    assert not check["ok"] and check["detail"] == "999 vs 1,000"
    text = report(results)
    assert "end to end, collector shape" in text and "280,000 messages (one trace each" in text
    assert "daemon peak RSS 410 MB" in text
    assert "1,000 messages of 300 spans (10.0 MB)" in text
    results["config"]["message_shape"] = "collector"  # every phase on the collector shape
    assert "1,000 messages of one trace (batches of 300 spans split) (10.0 MB)" in report(results)
    assert results["ratio"]["over_floor"]["end_to_end_collector"] == pytest.approx(0.05)
