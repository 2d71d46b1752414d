"""Redaction through the daemon on the real engines: a lost update on a table with sensitive columns, detected from
Kafka, written to FalkorDB, published on the incidents topic and filed on the (fake) GitLab as a confidential issue;
the customer's email and card number are in none of them (nor in the graph's rows), their redaction markers are."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from bench.gitlab_server import FakeGitLab
from processors.redaction import DROPPED
from tests.harness import Harness, harness_settings
from tests.runtime.chain import MS, S, Scenario

pytestmark = pytest.mark.engines

TOKEN = "glpat-redaction-live"
PROJECT = "trace-repro/shop"
EMAIL = "ann.lee@example.com"
CARD = "4111111111111111"
READ = "SELECT status, email FROM orders WHERE id = %s"
WRITE = "UPDATE orders SET status = %s, email = %s, card_number = %s WHERE id = %s"


def lost_update(s: Scenario, row: int, at_ns: int) -> None:
    """Two requests read the row, then both write it (status, email, card number): the first write is lost."""
    params = {
        "cancelled": f"('cancelled', '{EMAIL}', '{CARD}', {row})",
        "paid": f"('paid', '{EMAIL}', '{CARD}', {row})",
    }
    s._request("shop.jobs.expire_cart", "/jobs/expire", at_ns,
               [(READ, f"({row},)", 0, MS), (WRITE, params["cancelled"], 10 * MS, MS)])  # fmt: skip
    s._request("shop.handlers.capture_payment", "/orders/{id}/capture", at_ns + 2 * MS,
               [(READ, f"({row},)", 0, MS), (WRITE, params["paid"], 12 * MS, MS)])  # fmt: skip
    image = {"id": row, "email": EMAIL, "card_number": CARD}
    s._debezium("orders", {**image, "status": "pending"}, {**image, "status": "cancelled"}, at_ns + 11 * MS + MS // 2,
                "shop.jobs.expire_cart")  # fmt: skip
    s._debezium("orders", {**image, "status": "cancelled"}, {**image, "status": "paid"}, at_ns + 15 * MS,
                "shop.handlers.capture_payment")  # fmt: skip


async def test_a_filed_issue_and_the_incident_event_carry_markers_not_the_values(
    kafka_bootstrap: str, falkordb_url: str, tmp_path: Path
) -> None:
    """The email and card number of the row images and the statement parameters are dropped (no key is set) in the
    incidents topic, the file sink's JSON lines and the confidential GitLab issue; counted by action."""
    with FakeGitLab(token=TOKEN, project=PROJECT) as gitlab:
        settings = harness_settings(kafka_bootstrap, falkordb_url, GITLAB__URL=gitlab.url, GITLAB__PROJECT=PROJECT,
                                    GITLAB_TOKEN=TOKEN, GITLAB__CONFIDENTIAL="true", FILE_SINK__ENABLED="true",
                                    FILE_SINK__DIRECTORY=str(tmp_path))  # fmt: skip
        h = Harness(settings, kafka_bootstrap, falkordb_url)
        k = settings.kafka
        cdc = f"cdc{k.group_id.rsplit('-', 1)[1]}.public.orders"
        base = (time.time_ns() - 60 * S) // S * S
        scenario = Scenario()
        lost_update(scenario, 7, base)
        scenario.serial_update(row=99, at_ns=base + 20 * S, value="later")  # event time moves past the window
        try:
            await h.create_topics(cdc)
            await h.start()
            await h.produce(k.spans_topic, [v for _, v in sorted(scenario.spans)], key=None)
            for _, key, value, _ in sorted(scenario.changes):
                await h.produce(cdc, [value], key=key)
            messages = await h.consume_all(k.incidents_topic, expect=1, timeout_s=60)
            incidents = [json.loads(m.value) for m in messages]
            assert [(e["anomaly"], e["entity"]) for e in incidents] == [("lost_update", "orders:7")]
            raw = messages[0].value.decode()
            assert EMAIL not in raw and CARD not in raw
            e = incidents[0]
            assert {c["after"]["email"] for c in e["commits"]} == {DROPPED}
            assert {c["after"]["card_number"] for c in e["commits"]} == {DROPPED}
            assert {c["after"]["status"] for c in e["commits"]} == {"cancelled", "paid"}  # other columns kept
            writer = next(a for a in e["writers"] if a["statement"] == WRITE)
            assert writer["params"][1:3] == [DROPPED, DROPPED] and writer["params"][3] == 7
            await h.wait_for(lambda: len(gitlab.issues()) == 1, "the issue filed", timeout_s=60)
            [issue] = gitlab.issues()
            assert issue["confidential"] is True
            assert EMAIL not in issue["description"] and CARD not in issue["description"]
            assert DROPPED in issue["description"]
            await h.wait_for(lambda: "orders:7" in "".join(p.read_text() for p in tmp_path.rglob("*.jsonl")),
                             "the file sink's line")  # fmt: skip
            written = "".join(p.read_text() for p in tmp_path.rglob("*") if p.is_file())  # noqa: ASYNC240
            assert EMAIL not in written and CARD not in written and DROPPED in written
            graph = repr(h.graph_rows("MATCH (s:Span)-[x]->(e:Entity) RETURN s.statement, x, e.image"))
            assert EMAIL not in graph and CARD not in graph and DROPPED in graph  # what MCP's tools read
            assert h.daemon is not None
            counted = next(t for t in h.daemon.metrics.telemetry.all() if t.component == "redaction").events
            assert counted["redacted_drop"] >= 8 and counted["redacted_hash"] == 0
        finally:
            await h.stop()
