"""The sample shop on the real engines: its defects really happen, its fixes really hold, its spans decode with
the daemon's decoder, and Debezium sees the row changes that show each defect."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord

from bench.shop import db, reports
from bench.shop.errors import UpstreamTimeout
from bench.shop.evidence import Summary
from bench.shop.traffic import KINDS, run_traffic
from processors.model.events import CdcOp, RowChange, SpanKind
from processors.model.span import Span
from streamer.decode import decode_row_change, decode_traces_proto
from streamer.engines import LocalEngines

pytestmark = pytest.mark.engines

ROUNDS = 8
ROUTES = {"/orders/{order_id}/capture", "/checkout", "/orders/{order_id}/charges"}
SHOP = Path(__file__).resolve().parents[2] / "bench" / "shop"


def _unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


async def _consume(bootstrap: str, topics: list[str], done: Callable[[list[ConsumerRecord]], bool],
                   timeout_s: float = 60) -> list[ConsumerRecord]:  # fmt: skip
    """Every record of ``topics`` from the start, until ``done(records)`` or the timeout."""
    consumer = AIOKafkaConsumer(*topics, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                group_id=_unique("shop-test-"), enable_auto_commit=False)  # fmt: skip
    await consumer.start()
    records: list[ConsumerRecord] = []
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not done(records):
            batch = await consumer.getmany(timeout_ms=500)
            records += [r for rs in batch.values() for r in rs]
    finally:
        await consumer.stop()
    return records


def _traffic(dsn: str, bootstrap: str, **kwargs: Any) -> Summary:
    return run_traffic(dsn, bootstrap, **kwargs)


@pytest.fixture(scope="module")
async def buggy(postgres_dsn: str, kafka_bootstrap: str) -> tuple[Summary, str]:
    """One run of every buggy scenario, its spans on a topic of its own."""
    topic = _unique("shop-spans-")
    summary = await asyncio.to_thread(_traffic, postgres_dsn, kafka_bootstrap, scenario="all", rounds=ROUNDS,
                                      topic=topic, version="1.0.0", revision="abc1234")  # fmt: skip
    return summary, topic


def test_buggy_variants_manifest_every_defect(buggy: tuple[Summary, str]) -> None:
    """Under barrier-released concurrency each defect shows in the database, and its requests fail with 500."""
    summary, _ = buggy
    for kind in KINDS:
        result = summary.result(kind)
        assert result.manifested >= 1, str(summary)
        assert result.statuses.get(500, 0) >= 1, str(summary)
    assert summary.result("oversell").evidence["negative_stock"] >= 1
    assert summary.result("double_charge").evidence["duplicate_charges"] >= 1
    lost = summary.result("lost_update").evidence
    assert lost["lost_cancellations"] + lost["lost_payments"] == lost["manifested"]


async def test_clean_variants_never_manifest(postgres_dsn: str, kafka_bootstrap: str) -> None:
    """The fixed variants, same requests at the same concurrency: no defect, no 500."""
    summary = await asyncio.to_thread(_traffic, postgres_dsn, kafka_bootstrap, scenario="control", rounds=ROUNDS,
                                      topic=_unique("shop-spans-"), version="1.0.1")  # fmt: skip
    assert [r.scenario for r in summary.results] == list(KINDS)
    for result in summary.results:
        assert result.clean
        assert result.manifested == 0, str(summary)
        assert 500 not in result.statuses, str(summary)
        assert len(result.outcomes) == 2 * ROUNDS


def _source_line(file: str, line: int) -> str:
    return Path(file).read_text().splitlines()[line - 1]


def _by_id(spans: list[Span]) -> dict[str, Span]:
    return {s.span_id: s for s in spans}


def _handler_of(span: Span, index: dict[str, Span]) -> Span | None:
    """The nearest ancestor carrying ``code.function.name``."""
    parent = index.get(span.parent_id)
    while parent is not None and not parent.code_function:
        parent = index.get(parent.parent_id)
    return parent


async def test_exported_messages_decode_like_collector_output(buggy: tuple[Summary, str], kafka_bootstrap: str) -> None:
    """Messages keyed by trace id decode into spans with routes, code locations, statements and exceptions."""
    summary, topic = buggy
    n_server = ROUNDS * 5  # lost_update: 1 request + 1 job; oversell and double_charge: 2 requests each

    def all_servers(records: list[ConsumerRecord]) -> bool:
        spans = [s for r in records for s in decode_traces_proto(r.value)]
        return sum(s.kind is SpanKind.SERVER for s in spans) >= n_server

    records = await _consume(kafka_bootstrap, [topic], all_servers)
    spans: list[Span] = []
    for record in records:
        decoded = decode_traces_proto(record.value)
        assert decoded
        assert {record.key.decode()} == {s.trace_id for s in decoded}  # partition_traces_by_id
        spans += decoded
    index = _by_id(spans)
    assert len(index) == len(spans)
    assert {(s.resource.service, s.resource.version, s.resource.revision) for s in spans} == {
        ("shop", "1.0.0", "abc1234")
    }
    assert {s.resource.environment for s in spans} == {"bench"}

    servers = [s for s in spans if s.kind is SpanKind.SERVER]
    assert len(servers) == n_server
    assert {s.route for s in servers} == ROUTES
    assert all(s.name == f"POST {s.route}" for s in servers)
    assert {s.http_status for s in servers} <= {200, 409, 500}
    assert all(s.is_error == (s.http_status == 500) for s in servers)
    assert all(s.idempotency_key for s in servers if s.route != "/checkout")
    failed_roots = {s.trace_id for s in spans if s.is_error and not s.parent_id}
    assert failed_roots == {t for k in KINDS for t in summary.result(k).error_traces}

    errors = [s for s in spans if s.is_error]
    assert errors
    assert all(s.exception_type.startswith("bench.shop.errors.") and s.exception_message for s in errors)
    assert {s.exception_type.rsplit(".", 1)[1] for s in errors} == {
        "OrderChangedConcurrently",
        "Oversold",
        "IdempotencyKeyReused",
    }

    handlers = [s for s in spans if s.code_function]
    assert {s.code_function for s in handlers} == {
        "shop.handlers.capture_payment",
        "shop.handlers.checkout",
        "shop.handlers.charge",
        "shop.jobs.expire_cart",
    }
    for file, line, function in {(s.code_file, s.code_line, s.code_function) for s in handlers}:
        assert Path(file).parent == SHOP
        assert _source_line(file, line).startswith(f"def {function.rsplit('.', 1)[1]}(")

    db_spans = [s for s in spans if s.db is not None]
    assert db_spans and all(s.kind is SpanKind.CLIENT for s in db_spans)
    for s in db_spans:
        assert s.db is not None
        assert s.db.system == "postgresql" and s.db.namespace == "postgres"
        assert "%s" in s.db.statement
        assert len(s.db.params) == s.db.statement.count("%s")
        assert _handler_of(s, index) is not None  # every statement runs inside a request or job
    status_updates = [s for s in db_spans if s.db and s.db.statement.startswith("UPDATE orders SET status")]
    assert {s.db.params[0] for s in status_updates if s.db} == {"paid", "cancelled"}
    assert not any("COMMIT" in s.name or "BEGIN" in s.name for s in db_spans)


def _changes(records: list[ConsumerRecord]) -> list[RowChange]:
    out = []
    for r in records:
        change = decode_row_change(r.key, r.value, topic=r.topic, partition=r.partition, offset=r.offset)
        if change is not None:
            out.append(change)
    return out


async def test_debezium_captures_the_shop_tables(engines: LocalEngines, postgres_dsn: str,
                                                 kafka_bootstrap: str) -> None:  # fmt: skip
    """Every shop table is captured with full before images; each defect's row changes arrive."""
    db.apply_schema(postgres_dsn)
    prefix = _unique("shop")
    await asyncio.to_thread(engines.capture, list(db.TABLES), topic_prefix=prefix)
    summary = await asyncio.to_thread(_traffic, postgres_dsn, kafka_bootstrap, scenario="all", rounds=3,
                                      topic=_unique("shop-spans-"))  # fmt: skip
    lost = set(summary.result("lost_update").targets)
    skus = set(summary.result("oversell").targets)
    charged = set(summary.result("double_charge").targets)

    def ours(c: RowChange) -> bool:
        row = c.after or c.before or {}
        if c.table == "public.orders":
            return row.get("id") in lost
        if c.table == "public.inventory":
            return row.get("sku") in skus
        return row.get("order_id") in lost | charged

    def complete(records: list[ConsumerRecord]) -> bool:
        changes = [c for c in _changes(records) if ours(c)]
        tables = Counter((c.table, c.op) for c in changes)
        return (
            tables["public.orders", CdcOp.UPDATE] >= 2 * len(lost)
            and tables["public.inventory", CdcOp.UPDATE] >= 2 * len(skus)
            and tables["public.charges", CdcOp.CREATE] >= len(lost) + 2 * len(charged)
        )

    topics = [f"{prefix}.{t}" for t in db.TABLES]
    records = await _consume(kafka_bootstrap, topics, complete, timeout_s=90)
    changes = [c for c in _changes(records) if ours(c)]
    assert complete(records), Counter((c.table, c.op) for c in changes)

    by_order: defaultdict[Any, list[RowChange]] = defaultdict(list)
    for c in changes:
        if c.table == "public.orders" and c.op is CdcOp.UPDATE:
            by_order[c.key].append(c)
    for updates in by_order.values():
        first, second = sorted(updates, key=lambda c: c.lsn)[:2]
        assert first.before is not None and set(first.before) == {"id", "status", "amount", "version"}
        assert first.before["status"] == "pending" and first.before["version"] == 0
        assert second.before == first.after  # the second writer clobbered the first one's status
        assert second.after is not None and second.after["version"] == 2
    assert summary.result("lost_update").manifested == len(by_order)

    stock = [c.after["stock"] for c in changes if c.table == "public.inventory" and c.after]
    assert min(stock) == -1  # the stock >= 0 invariant, broken in the after image
    per_order = Counter(c.after["order_id"] for c in changes if c.table == "public.charges" and c.after)
    assert all(per_order[o] == 2 for o in charged)


STALL_S = 3.0  # three times the fix's timeout: a timeout that fires late on a busy machine still fires first


@pytest.mark.parametrize("analyzed", [False, True])
def test_a_stalled_report_waits_whatever_the_plan(postgres_dsn: str, analyzed: bool) -> None:
    """The hang scenario's stall holds for a status no order has, on fresh and on analyzed statistics (a planner
    that scans an empty match first must still run the stall), and the fix's statement timeout cuts it short."""
    db.apply_schema(postgres_dsn)
    status = _unique("none-")
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        if analyzed:
            conn.execute("ANALYZE orders")
        with reports.stalled(STALL_S):
            start = time.monotonic()
            answer = reports.sales_report(conn, status)
            waited = time.monotonic() - start
            start = time.monotonic()
            with pytest.raises(UpstreamTimeout):
                reports.sales_report(conn, status, clean=True)
            cut = time.monotonic() - start
    assert answer == {"status": status, "orders": 0, "amount": 0}
    assert waited >= STALL_S, waited
    assert reports.TIMEOUT_MS / 1000 <= cut < STALL_S, cut
