"""The rows the writer sends: a span's empty details go as null (no property stored), set ones as they are."""

from __future__ import annotations

from processors.graph.rows import PATH_SPAN_COLUMNS, SPAN_COLUMNS
from processors.model.graph import GraphBatch
from sinks.graph.rows import BARE, rows_for


def _span(columns: tuple[str, ...], **values: object) -> list[object]:
    empty: dict[str, object] = {"http_status": 0, "line": 0}
    return [values.get(c, empty.get(c, "")) for c in columns]


def test_a_spans_empty_details_are_sent_as_null_and_its_set_ones_unchanged() -> None:
    plain = _span(PATH_SPAN_COLUMNS, id="a", parent=None, name="GET", start=1.0, end=2.0, status="unset")
    db = _span(PATH_SPAN_COLUMNS, id="b", parent="a", name="db", statement="SELECT 1", line=7, http_status=500)
    trace = {"id": "t", "root": "GET", "service": "s", "start": 1.0, "end": 2.0, "status": "ok", "version": "1",
             "rooted": True, "spans": [plain, db]}  # fmt: skip
    batch = GraphBatch(traces=[trace])
    sent = rows_for(batch, "traces")[0][-1]
    assert [dict(zip(PATH_SPAN_COLUMNS, p, strict=True)) for p in sent] == [
        {**dict(zip(PATH_SPAN_COLUMNS, plain, strict=True)), **dict.fromkeys(BARE)},
        {**dict(zip(PATH_SPAN_COLUMNS, db, strict=True)), **dict.fromkeys(set(BARE) - {"statement", "line",
                                                                                        "http_status"})},
    ]  # fmt: skip
    assert sent[1][PATH_SPAN_COLUMNS.index("statement")] == "SELECT 1"
    assert rows_for(batch, "traces", empty=True)[0][-1] == [plain, db]  # the bench's form before
    assert trace["spans"] == [plain, db]  # the batch's own rows are not changed


def test_a_span_rows_empty_details_are_sent_as_null() -> None:
    row = dict(zip(SPAN_COLUMNS, _span(SPAN_COLUMNS, id="a", trace="t", route="/x"), strict=True))
    sent = dict(zip(SPAN_COLUMNS, rows_for(GraphBatch(spans=[row]), "spans")[0], strict=True))
    assert sent == {**row, **dict.fromkeys(set(BARE) - {"route"})}
