"""The file sink: JSON lines per kind, fsync, size rotation, no duplicate lines on replays or restarts, its
telemetry, and the component that builds it from its config section."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import ValidationError

from processors.api.telemetry import Telemetry
from processors.model.base import Published
from processors.model.outputs import (
    AccessInfo,
    DivergenceInfo,
    IncidentEvent,
    Receipt,
    ReproEvent,
    RunInfo,
    VerdictEvent,
)
from processors.model.regression import RegressionEvent
from sinks.base import RetryableSinkError
from sinks.files import FACTORY, FileSink, FileSinkConfig, event_id, file_name
from sinks.files.disk import JsonlFiles


def _access(trace: str) -> AccessInfo:
    return AccessInfo(trace_id=trace, span_id=f"{trace}-s", service="shop", version="1.0", function="capture",
                      file="shop/pay.py", route="/pay", operation="UPDATE", lock="none",
                      statement="UPDATE orders SET status = %s WHERE id = %s", params=["paid", 1], set_values={},
                      start_unix_ms=1.0, offset_ms=0.0, error=False, exception="", http_status=200)  # fmt: skip


def incident(occurrence: str, fingerprint: str = "fp1", summary: str = "lost update") -> IncidentEvent:
    a, b = _access("t1"), _access("t2")
    return IncidentEvent(fingerprint=fingerprint, occurrence=occurrence, anomaly="lost_update", severity="high",
                         manifest=True, entity="orders:1", table="orders", window_ms=2.0, summary=summary,
                         damage="", confidence=0.9, culprit=a, victim=b, writers=[a, b], accesses=[a, b], commits=[],
                         evidence=[], detected_at_unix_ms=1.0)  # fmt: skip


def repro(fingerprint: str, test_path: str, proven: bool = True) -> ReproEvent:
    run = RunInfo(status="failed", failure="assert 1 == 2", duration_ms=3.0)
    divergence = DivergenceInfo(faithful=True, index=None, expected=None, actual=None, mismatch=None)
    return ReproEvent(fingerprint=fingerprint, occurrence="o1", anomaly="lost_update", level="sql",
                      test_path=test_path, test_source="def test(): ...", red=run, green=None, patch="",
                      repairs=[], sql_rewrites=[], divergence=divergence, proven=proven)  # fmt: skip


def verdict(fingerprint: str, version: str, outcome: str, reason: str = "") -> VerdictEvent:
    receipt = Receipt(before_errors=5, before_requests=100, after_errors=0, after_requests=100, test="exact",
                      p_value=0.01, interval=None, must_start_seen=1, still_happens_at=[], requests_needed=50,
                      window_start_unix_ms=0.0, window_end_unix_ms=1.0)  # fmt: skip
    return VerdictEvent(fingerprint=fingerprint, contract="c", service="shop", version=version, commit="abc",
                        outcome=outcome, rollback=False, reason=reason, receipt=receipt)  # fmt: skip


def regression(occurrence: str, detected_at_unix_ms: float = 1.0) -> RegressionEvent:
    return RegressionEvent(fingerprint="fp1", occurrence=occurrence, service="shop", operation="POST /pay",
                           signature="latency:p95", metric="latency", version="2.0", previous_version="1.0",
                           commit="abc", window=occurrence, window_start_unix_ms=0.0, window_end_unix_ms=60_000.0,
                           summary="POST /pay got slower", evidence=[], critical_path=[],
                           detected_at_unix_ms=detected_at_unix_ms)  # fmt: skip


class NoteEvent(Published):
    """A kind the sink has no id fields for: deduplicated by its content."""

    kind: Literal["note"] = "note"
    fingerprint: str
    version: str


class Unnamed(Published):
    """A published model without a kind."""

    value: int


class FakeContext:
    """The part of ``processors.api.component.Context`` the file sink's factory uses."""

    def __init__(self) -> None:
        self.telemetries: dict[str, Telemetry] = {}

    def telemetry(self, component: str) -> Telemetry:
        return self.telemetries.setdefault(component, Telemetry(component))


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def largest(directory: Path) -> int:
    return max(p.stat().st_size for p in directory.iterdir())


async def test_flush_appends_one_json_line_per_event_to_the_kinds_file(tmp_path: Path) -> None:
    """Each kind goes to ``<kind>s.jsonl`` as the event's own JSON, which parses back to the same event."""
    sink = FileSink(tmp_path)
    events = [incident("o1"), repro("fp1", "tests/test_a.py"), verdict("fp1", "2.0", "FIXED"), incident("o2")]
    for e in events:
        await sink.write(e)
    await sink.flush()
    assert names(tmp_path) == ["incidents.jsonl", "repros.jsonl", "verdicts.jsonl"]
    assert [IncidentEvent.model_validate(d) for d in lines(tmp_path / "incidents.jsonl")] == [events[0], events[3]]
    assert ReproEvent.model_validate_json((tmp_path / "repros.jsonl").read_text()) == events[1]
    assert VerdictEvent.model_validate_json((tmp_path / "verdicts.jsonl").read_text()) == events[2]
    assert sink.written == 4
    await sink.close()


async def test_write_only_buffers_until_flush(tmp_path: Path) -> None:
    """Nothing reaches the disk before ``flush``."""
    sink = FileSink(tmp_path)
    await sink.write(incident("o1"))
    assert sink.buffered == 1
    assert not (tmp_path / "incidents.jsonl").exists()
    await sink.flush()
    assert sink.buffered == 0
    assert len(lines(tmp_path / "incidents.jsonl")) == 1


async def test_flush_fsyncs_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A flush fsyncs the file it appended to before it returns."""
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    sink = FileSink(tmp_path)
    await sink.write(incident("o1"))
    synced.clear()
    await sink.flush()
    assert synced


async def test_replayed_event_is_written_once(tmp_path: Path) -> None:
    """The same occurrence written again, buffered or already flushed, adds no line and counts a duplicate."""
    sink = FileSink(tmp_path)
    await sink.write(incident("o1"))
    await sink.write(incident("o1"))
    await sink.flush()
    await sink.write(incident("o1", summary="re-detected after a replay"))
    await sink.flush()
    assert [d["occurrence"] for d in lines(tmp_path / "incidents.jsonl")] == ["o1"]
    assert sink.telemetry.events["duplicates"] == 2


async def test_restart_remembers_written_events(tmp_path: Path) -> None:
    """A new sink on the same directory loads the ids from the files and skips what they hold."""
    first = FileSink(tmp_path)
    for e in (incident("o1"), incident("o2"), repro("fp1", "t.py"), verdict("fp1", "2", "FIXED")):
        await first.write(e)
    await first.close()
    second = FileSink(tmp_path)
    assert second.remembered("incident") == 2
    for e in (incident("o2"), incident("o3"), repro("fp1", "t.py"), verdict("fp1", "2", "FIXED")):
        await second.write(e)
    await second.close()
    assert [d["occurrence"] for d in lines(tmp_path / "incidents.jsonl")] == ["o1", "o2", "o3"]
    assert len(lines(tmp_path / "repros.jsonl")) == 1
    assert len(lines(tmp_path / "verdicts.jsonl")) == 1
    assert second.telemetry.events["duplicates"] == 3


async def test_identity_fields_per_kind(tmp_path: Path) -> None:
    """Repros are one per fingerprint and test path, verdicts one per fingerprint, version and outcome."""
    sink = FileSink(tmp_path)
    for e in (
        repro("fp1", "tests/a.py"),
        repro("fp1", "tests/b.py"),
        repro("fp1", "tests/a.py", proven=False),
        verdict("fp1", "2", "INSUFFICIENT"),
        verdict("fp1", "2", "FIXED"),
        verdict("fp1", "3", "FIXED"),
        verdict("fp1", "2", "FIXED", reason="same verdict again"),
    ):
        await sink.write(e)
    await sink.flush()
    assert [d["test_path"] for d in lines(tmp_path / "repros.jsonl")] == ["tests/a.py", "tests/b.py"]
    assert [(d["version"], d["outcome"]) for d in lines(tmp_path / "verdicts.jsonl")] == [
        ("2", "INSUFFICIENT"),
        ("2", "FIXED"),
        ("3", "FIXED"),
    ]
    assert event_id("verdict", {"fingerprint": "f", "version": "2", "outcome": "FIXED"}) != event_id(
        "verdict", {"fingerprint": "f", "version": "2F", "outcome": "IXED"}
    )


async def test_regressions_are_one_per_occurrence(tmp_path: Path) -> None:
    """Regressions go to ``regressions.jsonl``, one per occurrence even when re-detected at another time."""
    sink = FileSink(tmp_path)
    await sink.write(regression("w1", 1.0))
    await sink.write(regression("w2", 2.0))
    await sink.close()
    again = FileSink(tmp_path)
    await again.write(regression("w1", 9.0))
    await again.close()
    assert [d["occurrence"] for d in lines(tmp_path / "regressions.jsonl")] == ["w1", "w2"]


async def test_a_regression_written_twice_lands_in_regressions_jsonl_once(tmp_path: Path) -> None:
    """A ``RegressionEvent`` written twice, before and after a flush, is one line of ``regressions.jsonl``."""
    sink = FileSink(tmp_path)
    event = regression("w1")
    await sink.write(event)
    await sink.write(event)
    await sink.flush()
    await sink.write(event)
    await sink.close()
    assert names(tmp_path) == ["regressions.jsonl"]
    assert [RegressionEvent.model_validate(d) for d in lines(tmp_path / "regressions.jsonl")] == [event]
    assert sink.telemetry.events["duplicates"] == 2


async def test_other_kinds_are_deduplicated_by_content(tmp_path: Path) -> None:
    """A kind without id fields goes to ``<kind>s.jsonl``, deduplicated by its JSON across restarts."""
    sink = FileSink(tmp_path)
    await sink.write(NoteEvent(fingerprint="fp1", version="2"))
    await sink.write(NoteEvent(fingerprint="fp1", version="2"))
    await sink.write(NoteEvent(fingerprint="fp1", version="3"))
    await sink.close()
    again = FileSink(tmp_path)
    await again.write(NoteEvent(fingerprint="fp1", version="3"))
    await again.close()
    assert lines(tmp_path / "notes.jsonl") == [
        {"kind": "note", "fingerprint": "fp1", "version": "2"},
        {"kind": "note", "fingerprint": "fp1", "version": "3"},
    ]


async def test_rotation_by_size_keeps_n_files(tmp_path: Path) -> None:
    """Files rotate before they would pass ``max_bytes``; ``keep`` rotated files stay, the oldest are dropped."""
    line_size = len(incident("o00").model_dump_json()) + 1
    sink = FileSink(tmp_path, max_bytes=3 * line_size, keep=2)
    for i in range(10):
        await sink.write(incident(f"o{i:02}"))
        if i % 4 == 3:
            await sink.flush()
    await sink.close()
    files = names(tmp_path)
    assert files == ["incidents.jsonl", "incidents.jsonl.1", "incidents.jsonl.2"]
    assert largest(tmp_path) <= 3 * line_size
    order = [d["occurrence"] for name in reversed(files) for d in lines(tmp_path / name)]
    assert order == [f"o{i:02}" for i in range(3, 10)]  # o00..o02 were in the file dropped by the third rotation
    assert sink.rotations == {"incident": 3}


async def test_rotation_with_keep_zero_keeps_only_the_current_file(tmp_path: Path) -> None:
    """With ``keep=0`` a full file is deleted rather than renamed."""
    line_size = len(incident("o0").model_dump_json()) + 1
    sink = FileSink(tmp_path, max_bytes=2 * line_size, keep=0)
    for i in range(5):
        await sink.write(incident(f"o{i}"))
    await sink.close()
    assert names(tmp_path) == ["incidents.jsonl"]
    assert [d["occurrence"] for d in lines(tmp_path / "incidents.jsonl")] == ["o4"]
    assert sink.rotations == {"incident": 2}


async def test_restart_remembers_events_in_rotated_files(tmp_path: Path) -> None:
    """The tail read on start continues into the rotated files, newest first."""
    line_size = len(incident("o0").model_dump_json()) + 1
    first = FileSink(tmp_path, max_bytes=2 * line_size, keep=3)
    for i in range(6):
        await first.write(incident(f"o{i}"))
    await first.close()
    second = FileSink(tmp_path, max_bytes=2 * line_size, keep=3)
    assert second.remembered("incident") == 6
    await second.write(incident("o0"))
    await second.close()
    assert second.written == 0


async def test_remembered_ids_are_bounded(tmp_path: Path) -> None:
    """At most ``remember`` ids per kind are kept, each one forgotten counted as a drop; a replay of an older event
    is written again."""
    sink = FileSink(tmp_path, remember=3)
    for i in range(5):
        await sink.write(incident(f"o{i}"))
    await sink.flush()
    assert sink.remembered("incident") == 3
    assert sink.telemetry.dropped == {"remember": 2}
    await sink.write(incident("o4"))
    await sink.write(incident("o0"))
    await sink.close()
    assert sink.written == 6
    restarted = FileSink(tmp_path, remember=3)
    assert restarted.remembered("incident") == 3


async def test_tail_read_on_start_is_bounded(tmp_path: Path) -> None:
    """Only the last ``tail_bytes`` of the files are read on start, and the line cut by that bound is ignored."""
    line_size = len(incident("o0").model_dump_json()) + 1
    first = FileSink(tmp_path)
    for i in range(10):
        await first.write(incident(f"o{i}"))
    await first.close()
    second = FileSink(tmp_path, tail_bytes=3 * line_size + 5)
    assert second.remembered("incident") == 3
    await second.write(incident("o7"))
    await second.write(incident("o6"))
    await second.close()
    assert [d["occurrence"] for d in lines(tmp_path / "incidents.jsonl")][-1] == "o6"
    assert FileSink(tmp_path, tail_bytes=0).remembered("incident") == 0


async def test_torn_last_line_is_cut_off_on_start(tmp_path: Path) -> None:
    """A line without its newline (a crash mid-write) is removed on start, and its replay is written whole."""
    good = incident("o1").model_dump_json() + "\n"
    torn = incident("o2").model_dump_json()[:50]
    (tmp_path / "incidents.jsonl").write_text(good + torn)
    sink = FileSink(tmp_path)
    assert sink.repaired == 1
    assert (tmp_path / "incidents.jsonl").read_text() == good
    await sink.write(incident("o1"))
    await sink.write(incident("o2"))
    await sink.close()
    assert [d["occurrence"] for d in lines(tmp_path / "incidents.jsonl")] == ["o1", "o2"]


async def test_unparsable_lines_are_skipped_on_start(tmp_path: Path) -> None:
    """Lines that are not events of the kind are ignored when the ids are loaded."""
    content = "not json\n[1, 2]\n{}\n" + incident("o1").model_dump_json() + "\n"
    (tmp_path / "incidents.jsonl").write_text(content)
    sink = FileSink(tmp_path)
    assert sink.remembered("incident") == 1


def _failing_fsync(monkeypatch: pytest.MonkeyPatch, fail_on: Callable[[int], bool]) -> None:
    real = os.fsync
    calls = 0

    def fsync(fd: int) -> None:
        nonlocal calls
        calls += 1
        if fail_on(calls):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


async def test_failed_flush_is_retryable_and_loses_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk error raises ``RetryableSinkError``, takes the half-written lines back out and keeps them buffered:
    counted as a failed flush, never as a drop."""
    sink = FileSink(tmp_path)
    await sink.write(incident("o1"))
    await sink.flush()
    await sink.write(incident("o2"))
    await sink.write(incident("o3"))
    _failing_fsync(monkeypatch, lambda n: n == 1)
    with pytest.raises(RetryableSinkError, match="No space left"):
        await sink.flush()
    assert not await sink.healthcheck()
    assert sink.last_error is not None
    assert sink.buffered == 2
    assert [d["occurrence"] for d in lines(tmp_path / "incidents.jsonl")] == ["o1"]
    assert sink.telemetry.events["flush_failures"] == 1
    assert not any(sink.telemetry.dropped.values())
    await sink.write(incident("o2"))  # the runner replays the batch after its backoff
    await sink.flush()
    assert await sink.healthcheck()
    assert [d["occurrence"] for d in lines(tmp_path / "incidents.jsonl")] == ["o1", "o2", "o3"]


async def test_failed_flush_keeps_what_other_files_received(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When one kind's file fails after another's was written, only the failed kind is written on the retry."""
    sink = FileSink(tmp_path)
    for e in (incident("o1"), repro("fp1", "a.py"), incident("o2")):
        await sink.write(e)
    _failing_fsync(monkeypatch, lambda n: n == 3)  # 1: incidents.jsonl, 2: the directory, 3: repros.jsonl
    with pytest.raises(RetryableSinkError):
        await sink.flush()
    assert sink.buffered == 1
    await sink.flush()
    assert [d["occurrence"] for d in lines(tmp_path / "incidents.jsonl")] == ["o1", "o2"]
    assert len(lines(tmp_path / "repros.jsonl")) == 1
    assert sink.written == 3


async def test_cancelled_flush_records_what_the_thread_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A flush cancelled while its thread writes still remembers the lines, so a replay adds none."""
    started, release = threading.Event(), threading.Event()
    real = os.fsync

    def slow_fsync(fd: int) -> None:
        started.set()
        release.wait(5)
        real(fd)

    sink = FileSink(tmp_path)
    await sink.write(incident("o1"))
    monkeypatch.setattr(os, "fsync", slow_fsync)
    flushing = asyncio.create_task(sink.flush())
    await asyncio.to_thread(started.wait, 5)
    flushing.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await flushing
    assert sink.written == 1
    await sink.write(incident("o1"))
    await sink.close()
    assert len(lines(tmp_path / "incidents.jsonl")) == 1


async def test_unexpected_error_keeps_the_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error that is not a disk error is raised as it is, and the batch stays buffered."""
    sink = FileSink(tmp_path)
    await sink.write(incident("o1"))

    def broken(*_args: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(JsonlFiles, "write_kind", broken)
    with pytest.raises(RuntimeError, match="bug"):
        await sink.flush()
    assert sink.buffered == 1
    monkeypatch.undo()
    await sink.close()
    assert len(lines(tmp_path / "incidents.jsonl")) == 1


async def test_close_flushes_and_is_final(tmp_path: Path) -> None:
    """``close`` writes what is buffered, turns the healthcheck off, and a closed sink refuses events."""
    sink = FileSink(tmp_path)
    assert await sink.healthcheck()
    await sink.write(incident("o1"))
    await sink.close()
    await sink.close()
    assert len(lines(tmp_path / "incidents.jsonl")) == 1
    assert not await sink.healthcheck()
    with pytest.raises(RuntimeError, match="closed"):
        await sink.write(incident("o2"))


async def test_healthcheck_fails_when_the_directory_is_gone(tmp_path: Path) -> None:
    """A sink whose directory disappeared reports unhealthy."""
    directory = tmp_path / "events"
    sink = FileSink(directory)
    directory.rmdir()
    assert not await sink.healthcheck()


async def test_events_without_a_valid_kind_are_refused(tmp_path: Path) -> None:
    """A model with no ``kind`` or a kind that is not a safe file name raises."""
    sink = FileSink(tmp_path)
    with pytest.raises(TypeError):
        await sink.write(Unnamed(value=1))
    with pytest.raises(ValueError, match="file name"):
        file_name("../etc/passwd")
    assert file_name("incident") == "incidents.jsonl"


def test_invalid_limits_are_refused(tmp_path: Path) -> None:
    """Non-positive sizes or counts are configuration errors."""
    with pytest.raises(ValueError):
        FileSink(tmp_path, max_bytes=0)
    with pytest.raises(ValueError):
        FileSink(tmp_path, remember=0)


def test_the_factory_builds_the_sink_from_its_section(tmp_path: Path) -> None:
    """``file_sink`` consumes incidents, repros and verdicts, runs only when enabled, and builds the sink from its
    section with the daemon's telemetry of ``file_sink``."""
    config = FileSinkConfig(enabled=True, directory=str(tmp_path / "events"), max_bytes=2048, keep=2, remember=7,
                            tail_bytes=0)  # fmt: skip
    ctx = FakeContext()
    sink = FACTORY.create(config, ctx)  # type: ignore[arg-type]
    assert (FACTORY.kind, FACTORY.name, FACTORY.config) == ("sink", "file_sink", FileSinkConfig)
    assert tuple(FACTORY.topics) == ("incidents", "repros", "verdicts")
    assert FACTORY.enabled(config) and not FACTORY.enabled(FileSinkConfig())
    assert isinstance(sink, FileSink) and sink.name == "files"
    assert (sink.directory, sink.max_bytes, sink.keep, sink.remember, sink.tail_bytes) == (
        tmp_path / "events", 2048, 2, 7, 0)  # fmt: skip
    assert sink.telemetry is ctx.telemetries["file_sink"]


def test_the_config_section_keeps_its_defaults_and_bounds_and_describes_every_field() -> None:
    """The ``[file_sink]`` defaults, a description per field, bounds and unknown keys refused by name."""
    mib = 1024 * 1024
    assert FileSinkConfig().model_dump() == {"enabled": False, "directory": "out/events", "max_bytes": 64 * mib,
                                             "keep": 5, "remember": 100_000, "tail_bytes": 16 * mib}  # fmt: skip
    assert all(field.description for field in FileSinkConfig.model_fields.values())
    with pytest.raises(ValidationError, match="directry"):
        FileSinkConfig(directry="x")  # type: ignore[call-arg]
    for bad in ({"max_bytes": 1023}, {"keep": -1}, {"remember": 0}, {"tail_bytes": -1}):
        with pytest.raises(ValidationError):
            FileSinkConfig(**bad)  # type: ignore[arg-type]
