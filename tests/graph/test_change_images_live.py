"""An entity's image on the real FalkorDB is its latest committed change's, however its changes are batched."""

from __future__ import annotations

import json

import pytest

from processors.graph.rows import change_row
from processors.model.events import CdcOp, RowChange
from processors.model.graph import GraphBatch
from sinks.graph.sink import GraphSink

pytestmark = pytest.mark.engines


def _change(op: CdcOp, lsn: int, amount: str | None) -> RowChange:
    row = {"id": 1, "amount": amount}
    return RowChange(table="public.prices", op=op, key=(("id", 1),), before=row if op is CdcOp.DELETE else None,
                     after=None if op is CdcOp.DELETE else row, commit_ts_ms=1_000 + lsn, ts_ms=0, lsn=lsn, tx_id="7",
                     topic="t", partition=0, offset=lsn)  # fmt: skip


async def _image(sink: GraphSink) -> list[object]:
    rows = await sink.writer.query("MATCH (e:Entity {key: 'prices:1'}) RETURN e.image, e.deleted, e.lsn", {})
    return [json.loads(rows[0][0]), rows[0][1], rows[0][2]]


async def test_insert_update_delete_in_one_batch_leave_the_latest_image(sink: GraphSink) -> None:
    """FalkorDB does not apply one UNWIND's SETs on a node in row order: the highest LSN's image wins."""
    batch = GraphBatch()
    for change in (_change(CdcOp.CREATE, 10, "12.50"), _change(CdcOp.UPDATE, 20, "99.99"),
                   _change(CdcOp.DELETE, 30, "99.99")):  # fmt: skip
        batch.changes.append(change_row(change, "prices:1", None))
    await sink.write_batch(batch)
    assert await _image(sink) == [{"id": 1, "amount": "99.99"}, True, 30]


async def test_a_replayed_older_change_never_overwrites_a_newer_image(sink: GraphSink) -> None:
    for change in (_change(CdcOp.UPDATE, 20, "99.99"), _change(CdcOp.CREATE, 10, "12.50")):
        batch = GraphBatch()
        batch.changes.append(change_row(change, "prices:1", None))
        await sink.write_batch(batch)
    assert await _image(sink) == [{"id": 1, "amount": "99.99"}, False, 20]
