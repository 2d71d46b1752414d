"""The repro worker on the new classes, with the default configuration (no invariants): RED, faithful, planned,
GREEN — at application level with call specs derived from the spans and the source, or hand-written ones, against a
patched copy; at SQL level from the plan's SQL form, and falling back to SQL level when the application-level repro
cannot be compiled. And its hardening: a fingerprint that is not one is refused before it names a path, a directory
that would resolve outside the output directory is neither written nor deleted, and an incident whose repro could not
be compiled is tried again on later occurrences, up to the bound.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from processors.connectors.repro.config import ReproConfig
from processors.connectors.repro.worker import MAX_ATTEMPTS, ReproWorker
from processors.model.outputs import IncidentEvent, Published, ReproEvent
from processors.repro import CallSpec, Param
from processors.repro.derive import derive_call_specs
from tests.repair.test_repair_anomalies import source_copy
from tests.repro.anomalies import CASES, CLINIC

pytestmark = pytest.mark.engines


class Graph:
    """What the worker asks the graph: nothing is recorded yet, no other code site is known."""

    async def repro_known(self, fingerprint: str) -> bool:
        return False

    async def table_sites(self, table: str) -> list[tuple[str, str, str, str, str]]:
        return []

    async def record_repro(self, event: Published) -> list[tuple[str, str, str]]:
        return []


class Worker:
    """A repro worker on the stub graph, and what it published."""

    def __init__(self, out: Path, dsn: str, root: Path | None = None, *, max_attempts: int = MAX_ATTEMPTS,
                 **config: Any) -> None:  # fmt: skip
        self.published: list[Published] = []
        paths: dict[str, Any] = {"source_root": str(root)} if root is not None else {}
        settings = ReproConfig(enabled=True, output_dir=str(out), **paths, **config)
        self.worker = ReproWorker(settings, graph=Graph(), publish=self.publish, dsn=dsn,  # type: ignore[arg-type]
                                  invariants={}, max_attempts=max_attempts)  # fmt: skip

    async def publish(self, event: Published) -> None:
        self.published.append(event)

    async def feed(self, *incidents: IncidentEvent) -> list[Published]:
        """Each incident written and flushed, as the sink runner hands them over; what was published meanwhile."""
        before = len(self.published)
        for incident in incidents:
            await self.worker.write(incident)
            await self.worker.flush()
        return self.published[before:]


async def prove(incident: IncidentEvent, root: Path, dsn: str, out: Path, **config: Any) -> ReproEvent:
    worker = Worker(out, dsn, root, copy_paths=["bench", "tests/repair/clinic"], **config)
    [event] = await worker.feed(incident)
    assert isinstance(event, ReproEvent)
    return event


async def test_write_skew_is_proven_at_application_level_with_derived_call_specs(postgres_dsn: str,
                                                                                tmp_path: Path) -> None:  # fmt: skip
    """No call specs configured: the clinic's ``go_off_call(conn, name, shift)`` is found in the source root by its
    recorded file and name, its arguments by the columns its statements bind; the application-level repro is RED,
    the plan locks the count, and the same test against the patched copy is GREEN."""
    root = source_copy(tmp_path / "app")
    incident = CASES["write_skew"](root)
    derived = derive_call_specs(incident, source_root=root)
    assert derived.specs == {"clinic.oncall.go_off_call": CallSpec(
        "tests.repair.clinic.oncall:go_off_call", (), (("shift", Param(0, 0)), ("name", Param(1, 0))))}  # fmt: skip
    event = await prove(incident, root, postgres_dsn, tmp_path / "out", schema_sql=str(CLINIC / "schema.sql"))
    assert (event.level, event.red.status, event.divergence.faithful) == ("app", "failed", True), event.red
    assert "'target': 'tests.repair.clinic.oncall:go_off_call'" in event.test_source
    assert event.green is not None and event.green.status == "passed", event.green
    assert [r.strategy for r in event.repairs] == ["row_lock"] and event.proven


OVERRIDE = {"clinic.oncall.go_off_call": CallSpec("tests.repair.clinic.oncall:go_off_call", (Param(0, 5),))}


async def test_a_hand_spec_overrides_the_derived_one_and_sql_level_proves_it(postgres_dsn: str,
                                                                            tmp_path: Path) -> None:  # fmt: skip
    """A hand-written spec wins over the derived one, even one that cannot be called (a parameter the recording does
    not have): then the SQL-level repro is RED, the plan locks the count, and the same incident with the locked count
    is GREEN."""
    root = source_copy(tmp_path / "app")
    event = await prove(CASES["write_skew"](root), root, postgres_dsn, tmp_path / "out",
                        schema_sql=str(CLINIC / "schema.sql"),
                        call_specs="tests.repro.test_repro_worker:OVERRIDE")  # fmt: skip
    assert (event.level, event.red.status, event.divergence.faithful) == ("sql", "failed", True)
    assert event.green is not None and event.green.status == "passed", event.green
    assert [r.strategy for r in event.repairs] == ["row_lock"] and event.proven


async def test_the_shops_phantom_is_proven_at_application_level(postgres_dsn: str, tmp_path: Path) -> None:
    """The shop's double charge as the pipeline reports it (a phantom), with the shop's own call specs, the way
    ``make demo`` runs the worker: RED (the provider refuses the second charge), the idempotency key repairs it,
    GREEN against the patched copy."""
    root = source_copy(tmp_path / "app")
    event = await prove(CASES["phantom"](root), root, postgres_dsn, tmp_path / "out",
                        call_specs="bench.shop.repro_specs:CALL_SPECS",
                        schema_sql=str(root / "bench" / "shop" / "schema.sql"))  # fmt: skip
    assert (event.level, event.red.status, event.divergence.faithful) == ("app", "failed", True)
    assert "IdempotencyKeyReused" in event.red.failure
    assert event.green is not None and event.green.status == "passed", event.green
    assert [r.strategy for r in event.repairs] == ["idempotency_guard"] and event.proven


UNUSABLE = {"shop.handlers.charge": CallSpec("bench.shop.handlers:charge", (Param(0, 5),))}


async def test_a_repro_the_call_specs_cannot_call_falls_back_to_sql_level(postgres_dsn: str, tmp_path: Path) -> None:
    """Call specs that name a parameter the recording does not have: no application-level repro; the SQL-level one
    is RED, and the idempotency key (not in the recording) leaves it without a SQL-level GREEN: not proven."""
    root = source_copy(tmp_path / "app")
    event = await prove(CASES["phantom"](root), root, postgres_dsn, tmp_path / "out",
                        call_specs="tests.repro.test_repro_worker:UNUSABLE",
                        schema_sql=str(root / "bench" / "shop" / "schema.sql"))  # fmt: skip
    assert (event.level, event.red.status) == ("sql", "failed")
    assert event.green is None and not event.proven


# ---- hardening: fingerprints, paths, retries -------------------------------------------------------------------


def tree(directory: Path) -> set[Path]:
    return set(directory.rglob("*"))


def sentinel(directory: Path) -> Path:
    """A file in ``directory`` that must survive the worker."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "keep.txt").write_text("precious\n", encoding="utf-8")
    return directory / "keep.txt"


@pytest.mark.parametrize("fingerprint", ["../../etc", "../victim", "..", "/tmp", "E6F4599449DAE92C",
                                         "e6f4599449dae92c0", "e6f4599449dae92", "e6f4599449dae92g", ""])  # fmt: skip
async def test_a_crafted_fingerprint_is_refused_and_deletes_nothing(tmp_path: Path, fingerprint: str) -> None:
    """A fingerprint that is not 16 lowercase hex digits is dropped at ``write`` (counted ``invalid_fingerprint``):
    nothing is compiled, run, written, deleted or published, and the work and repro directories are not created."""
    root = source_copy(tmp_path / "app")
    out = tmp_path / "deep" / "out"
    kept = sentinel(tmp_path / "victim")
    outside = tree(tmp_path)
    worker = Worker(out, "postgresql://nowhere.invalid/none", root, schema_sql=str(CLINIC / "schema.sql"))
    incident = CASES["write_skew"](root).model_copy(update={"fingerprint": fingerprint})
    assert await worker.feed(incident) == []
    assert worker.worker.telemetry.dropped["invalid_fingerprint"] == 1
    assert kept.read_text(encoding="utf-8") == "precious\n"
    assert tree(tmp_path) == outside and not out.exists()


async def test_a_work_directory_that_resolves_outside_the_output_is_neither_written_nor_deleted(
    tmp_path: Path,
) -> None:
    """``out/work`` a symlink to another directory: the incident's work directory would resolve there, so the
    incident is refused (``unsafe_path``) before its old contents are deleted or anything is run; it is not tried
    again."""
    root = source_copy(tmp_path / "app")
    out = tmp_path / "out"
    incident = CASES["write_skew"](root)
    elsewhere = tmp_path / "elsewhere"
    kept = sentinel(elsewhere / incident.fingerprint)
    out.mkdir()
    os.symlink(elsewhere, out / "work")
    worker = Worker(out, "postgresql://nowhere.invalid/none", root, schema_sql=str(CLINIC / "schema.sql"))
    assert await worker.feed(incident, incident.model_copy(update={"occurrence": "0" * 16})) == []
    assert worker.worker.telemetry.dropped["unsafe_path"] == 1  # once: a refused fingerprint is settled
    assert kept.read_text(encoding="utf-8") == "precious\n"
    assert sorted(p.name for p in tree(elsewhere)) == [incident.fingerprint, "keep.txt"]
    assert not (out / "repros").exists()


def unrecorded(incident: IncidentEvent, occurrence: str) -> IncidentEvent:
    """Another occurrence of ``incident`` whose spans carried no statement parameters and whose row changes were not
    captured (nothing to read them back from): it cannot be compiled."""
    bare = [a.model_copy(update={"params": []}) for a in incident.accesses]
    return incident.model_copy(update={"occurrence": occurrence, "accesses": bare, "commits": [],
                                       "writers": [a for a in bare if a.operation != "read"]})  # fmt: skip


async def test_a_repro_that_did_not_compile_is_tried_again_on_a_later_occurrence(postgres_dsn: str,
                                                                                  tmp_path: Path) -> None:  # fmt: skip
    """The first occurrence has no parameters (no repro); the second is complete: the worker tries again and
    publishes its repro; a third occurrence is not tried (the fingerprint is settled)."""
    root = source_copy(tmp_path / "app")
    incident = CASES["write_skew"](root)
    worker = Worker(tmp_path / "out", postgres_dsn, root, schema_sql=str(CLINIC / "schema.sql"))
    assert await worker.feed(unrecorded(incident, "1" * 16)) == []
    assert worker.worker.attempts(incident.fingerprint) == 1
    [event] = await worker.feed(incident)
    assert isinstance(event, ReproEvent) and event.occurrence == incident.occurrence
    assert event.red.status == "failed" and event.proven, event.red
    assert await worker.feed(incident.model_copy(update={"occurrence": "3" * 16})) == []
    telemetry = worker.worker.telemetry
    assert (telemetry.events["not_compiled"], telemetry.events["repros"]) == (1, 1)


async def test_retries_stop_at_the_bound(tmp_path: Path) -> None:
    """With ``max_attempts=2``, two occurrences that cannot be compiled are both tried; a third, even a complete
    one, is not (counted ``max_attempts``); another fingerprint is tried as usual."""
    root = source_copy(tmp_path / "app")
    incident = CASES["write_skew"](root)
    worker = Worker(tmp_path / "out", "postgresql://nowhere.invalid/none", root, max_attempts=2,
                    schema_sql=str(CLINIC / "schema.sql"))  # fmt: skip
    assert await worker.feed(unrecorded(incident, "1" * 16), unrecorded(incident, "2" * 16), incident) == []
    telemetry = worker.worker.telemetry
    assert (telemetry.events["not_compiled"], telemetry.dropped["max_attempts"]) == (2, 1)
    assert worker.worker.attempts(incident.fingerprint) == 2
    other = unrecorded(incident, "4" * 16).model_copy(update={"fingerprint": "0123456789abcdef"})
    assert await worker.feed(other) == []
    assert telemetry.events["not_compiled"] == 3 and not (tmp_path / "out").exists()


async def test_the_memory_of_attempts_is_bounded(tmp_path: Path) -> None:
    """At most ``max_tracked`` fingerprints' attempts are remembered; the least recently tried is forgotten first,
    counted (``max_tracked_fingerprints``)."""
    root = source_copy(tmp_path / "app")
    incident = CASES["write_skew"](root)
    settings = ReproConfig(enabled=True, output_dir=str(tmp_path / "out"), source_root=str(root))

    async def publish(event: Published) -> None:
        raise AssertionError(f"nothing compiles, yet {event!r} was published")

    worker = ReproWorker(settings, graph=Graph(), publish=publish, dsn="",  # type: ignore[arg-type]
                         invariants={}, max_tracked=2)  # fmt: skip
    for n in range(3):
        await worker.write(unrecorded(incident, f"{n:016x}").model_copy(update={"fingerprint": f"{n:016x}"}))
        await worker.flush()
    assert [worker.attempts(f"{n:016x}") for n in range(3)] == [None, 1, 1]
    assert worker.telemetry.dropped["max_tracked_fingerprints"] == 1
