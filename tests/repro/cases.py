"""Shared cases of the repro tests: the captured shop incidents, their hand-protected statements (GREEN at SQL
level), the hand patches of a copy of the shop (GREEN at application level), and a parallel runner."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from processors.model.outputs import IncidentEvent, RunInfo
from processors.repro import ExecutedStatement, SqlRewrite

HERE = Path(__file__).parent
REPO = HERE.parents[1]
INCIDENTS = HERE / "golden" / "incidents"
ANOMALIES = ("lost_update", "invariant_violation", "duplicate_apply")
CAPTURED_ROOT = "/work/main"  # where tests/repro/capture_incidents.py ran

# What each RED run must report: the production failure, named.
RED_SQL = {
    "lost_update": "lost update on orders:1000: status = 'cancelled' committed by session 1 (shop.jobs.expire_cart)",
    "invariant_violation": "invariant stock >= 0 broken on inventory:sku-d3912d92-0: final row {'sku': "
    "'sku-d3912d92-0', 'stock': -1}",
    "duplicate_apply": "duplicate apply on charges:order_id=1009: 2 rows for one {'order_id': 1009}",
}
RED_APP = {  # ... and, at application level, the exception the victim's request failed with
    "lost_update": "OrderChangedConcurrently: order 1000 changed concurrently: read version 0, wrote version 2",
    "invariant_violation": "Oversold: sku sku-d3912d92-0 oversold: no unit left to allocate (stock is now -1)",
    "duplicate_apply": "IdempotencyKeyReused: idempotency key 'pay-1009' already captured charge 1; refused charge 2",
}

# The protected form of each defect's statement, written by hand (the repair planner's job in production).
PROTECTED = {
    "lost_update": [
        SqlRewrite(
            "SELECT status, version, amount FROM orders WHERE id = %s",
            "SELECT status, version, amount FROM orders WHERE id = %s FOR UPDATE",
        )
    ],
    "invariant_violation": [
        SqlRewrite(
            "UPDATE inventory SET stock = stock - 1 WHERE sku = %s RETURNING stock",
            "UPDATE inventory SET stock = stock - 1 WHERE sku = %s AND stock >= 1 RETURNING stock",
        )
    ],
    "duplicate_apply": [
        SqlRewrite(
            "INSERT INTO charges (order_id, amount) VALUES (%s, %s) RETURNING id",
            "INSERT INTO charges (order_id, amount, idempotency_key) VALUES (%s, %s, %s)"
            " ON CONFLICT (idempotency_key) DO NOTHING RETURNING id",
            ((2, "pay-1009"),),
        )
    ],
}

# The same protections as text edits of a copy of the shop's source (file, before, after).
PATCHES = {
    "lost_update": [
        ("handlers.py", "cur.execute(READ_ORDER, (order_id,))", 'cur.execute(READ_ORDER + " FOR UPDATE", (order_id,))'),
        ("jobs.py", "cur.execute(READ_ORDER, (order_id,))", 'cur.execute(READ_ORDER + " FOR UPDATE", (order_id,))'),
    ],
    "invariant_violation": [
        ("handlers.py", 'guard = " AND stock >= 1" if clean else ""', 'guard = " AND stock >= 1"'),
        ("handlers.py", "if row is None and clean:", "if row is None:"),
    ],
    "duplicate_apply": [
        ("handlers.py", "idempotency_key, clean=clean, race=True)", "idempotency_key, clean=True, race=True)"),
    ],
}


def incident(anomaly: str) -> IncidentEvent:
    """A golden incident, as the daemon published it for one round of the buggy shop (its source paths rebased
    from the machine it was captured on to this checkout)."""
    text = (INCIDENTS / f"{anomaly}.json").read_text(encoding="utf-8")
    text = text.replace(json.dumps(CAPTURED_ROOT + "/")[:-1], json.dumps(str(REPO) + "/")[:-1])
    return IncidentEvent.model_validate_json(text)


def patched_shop(root: Path, anomaly: str) -> Path:
    """A copy of ``bench/shop`` under ``root`` with the hand protection of ``anomaly``; returns the source root."""
    (root / "bench").mkdir(parents=True)
    (root / "bench" / "__init__.py").write_text("", encoding="utf-8")
    shutil.copytree(REPO / "bench" / "shop", root / "bench" / "shop", ignore=shutil.ignore_patterns("__pycache__"))
    for name, before, after in PATCHES[anomaly]:
        path = root / "bench" / "shop" / name
        text = path.read_text(encoding="utf-8")
        assert before in text, f"{name} no longer contains {before!r}"
        path.write_text(text.replace(before, after), encoding="utf-8")
    return root


Run = tuple[RunInfo, list[ExecutedStatement]]


def run_all(jobs: Mapping[str, Callable[[], Run]], workers: int | None = None) -> dict[str, Run]:
    """Run independent repro runs (each a subprocess with its own scratch database) in parallel, one per core (at
    most four): four at once on two cores, beside the suite's engines, once pushed a repro statement past the
    sandbox's 5 s statement timeout, and the run was an error instead of its RED."""
    workers = workers or min(4, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        return {name: f.result() for name, f in futures.items()}
