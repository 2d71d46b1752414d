"""A repro's scratch database and role are gone whatever ends its run: the run's own end, its timeout (the test is
killed and cannot drop them), or a daemon killed mid-run (the sweep of old leftovers)."""

from __future__ import annotations

import dataclasses
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from bench.shop.repro_specs import SCHEMA_SQL
from processors.repro import compile_repro, run_repro, runner
from processors.repro import template_database as template
from tests.repro.cases import incident

# Appended to a generated repro: its run hangs once its scratch database and role exist, until its timeout.
HANG = """

_prepare = prepare


def prepare(dsn: str) -> None:
    _prepare(dsn)
    time.sleep(600)
"""


def scratch_of(dsn: str, tag: str) -> list[str]:
    """The databases and roles whose names start ``repro_<tag>_``."""
    like = f"repro\\_{tag}\\_%"
    with psycopg.connect(dsn) as conn:
        found = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s "
                             "UNION ALL SELECT rolname FROM pg_roles WHERE rolname LIKE %s", (like, like))  # fmt: skip
        return sorted(r[0] for r in found.fetchall())


@pytest.mark.engines
def test_a_repro_killed_at_its_timeout_leaves_no_role_or_database(
    postgres_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real repro that hangs after creating its scratch database is killed at its timeout: the run is an error,
    and neither its database nor its role is left on the server."""
    fingerprint = secrets.token_hex(8)
    event = incident("lost_update").model_copy(update={"fingerprint": fingerprint})
    test = compile_repro(event, schema_sql=SCHEMA_SQL)
    test = dataclasses.replace(test, source=test.source + HANG)
    monkeypatch.setattr(runner, "TIMEOUT_S", 10.0)
    seen: list[str] = []
    with ThreadPoolExecutor(max_workers=1) as pool:
        running = pool.submit(run_repro, test, dsn=postgres_dsn, workdir=tmp_path)
        deadline = time.monotonic() + 60
        while len(seen) < 2 and not running.done() and time.monotonic() < deadline:  # its database and role
            seen = scratch_of(postgres_dsn, fingerprint)
            time.sleep(0.05)  # how often the server is asked, not what the test asserts
        run, _ = running.result(timeout=120)
    assert len(seen) == 2, f"the run never had its database and role before its timeout: {seen}"
    assert run.status == "error" and "timed out" in run.failure, run.failure
    assert scratch_of(postgres_dsn, fingerprint) == []


@pytest.mark.engines
def test_the_sweep_drops_old_leftovers_of_the_naming_scheme_only(postgres_dsn: str) -> None:
    """Databases and roles of the runs' naming scheme older than a run can last are dropped (a role left without
    its database too); a young one, and a name outside the scheme, stay."""
    tag, now = secrets.token_hex(6), time.time()
    old = runner.scratch_name(tag, now - runner.TIMEOUT_S - runner.SWEEP_MARGIN_S - 5)
    role_only = runner.scratch_name(tag, now - 86_400)  # a run killed between its CREATE ROLE and CREATE DATABASE
    young = runner.scratch_name(tag, now - 5)
    other = f"repro_{tag}_keep"
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        for name in (old, role_only, young, other):
            admin.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(name)))
            if name != role_only:
                admin.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(name), sql.Identifier(name)))
    try:
        swept = runner.sweep_scratch(postgres_dsn, now_s=now)
        assert {old, role_only} <= set(swept) and not {young, other} & set(swept)
        assert scratch_of(postgres_dsn, tag) == sorted([young, young, other, other])
    finally:
        assert runner.drop_scratch(postgres_dsn, [old, role_only, young, other])
    assert scratch_of(postgres_dsn, tag) == []


def test_the_generated_test_names_its_database_by_the_runner_or_by_the_swept_scheme(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run takes the name its runner chose (and drops); run by hand, it names itself in the scheme the sweep
    knows."""
    monkeypatch.delenv("REPRO_SCRATCH_NAME", raising=False)
    assert runner.SCRATCH.fullmatch(template.scratch_name())
    monkeypatch.setenv("REPRO_SCRATCH_NAME", "repro_chosen_1700000000_abcdef")
    assert template.scratch_name() == "repro_chosen_1700000000_abcdef"
    assert runner.SCRATCH.fullmatch(runner.scratch_name("0123456789ABCDEF-x"))
