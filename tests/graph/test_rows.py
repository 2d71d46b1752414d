"""The rows the writer sends: a span's empty details go as null (no property stored), set ones as they are."""

from __future__ import annotations

from processors.graph.rows import PATH_SPAN_COLUMNS, SPAN_COLUMNS
from processors.model.graph import GraphBatch
from sinks.graph.rows import BARE, linked, rows_for, sent


def _span(columns: tuple[str, ...], **values: object) -> list[object]:
    empty: dict[str, object] = {"http_status": 0, "line": 0}
    return [values.get(c, empty.get(c, "")) for c in columns]


def test_a_spans_empty_details_are_sent_as_null_and_its_set_ones_unchanged() -> None:
    plain = _span(PATH_SPAN_COLUMNS, id="a", parent=None, name="GET", start=1.0, end=2.0, status="unset")
    db = _span(PATH_SPAN_COLUMNS, id="b", parent="a", name="db", statement="SELECT 1", line=7, http_status=500)
    trace = {"id": "t", "root": "GET", "service": "s", "start": 1.0, "end": 2.0, "status": "ok", "version": "1",
             "rooted": True, "spans": [plain, db]}  # fmt: skip
    batch = GraphBatch(traces=[trace])
    expected = [
        {**dict(zip(PATH_SPAN_COLUMNS, plain, strict=True)), **dict.fromkeys(BARE)},
        {**dict(zip(PATH_SPAN_COLUMNS, db, strict=True)), **dict.fromkeys(set(BARE) - {"statement", "line",
                                                                                        "http_status"})},
    ]  # fmt: skip
    rows = rows_for(batch, "traces")
    looked_up = sent(rows)[0][-1]  # the lookup and merging statements' form
    assert [dict(zip(PATH_SPAN_COLUMNS, p, strict=True)) for p in looked_up] == expected
    assert looked_up[1][PATH_SPAN_COLUMNS.index("statement")] == "SELECT 1"
    fresh = linked(rows)[0][0][-2]  # FRESH's form: the same, the parent's place after, its id only when not there
    assert [dict(zip(PATH_SPAN_COLUMNS, p[:-1], strict=True)) for p in fresh] == [
        expected[0], {**expected[1], "parent": None}]  # fmt: skip
    assert [p[-1] for p in fresh] == [-1, 0]
    assert sent(rows, empty=True)[0][-1] == [plain, db]  # the bench's form before
    assert [p[:-1] for p in linked(rows, empty=True)[0][0][-2]] == [plain, [*db[:1], None, *db[2:]]]
    assert trace["spans"] == [plain, db]  # the batch's own rows are not changed


def test_a_span_rows_empty_details_are_sent_as_null() -> None:
    row = dict(zip(SPAN_COLUMNS, _span(SPAN_COLUMNS, id="a", trace="t", route="/x"), strict=True))
    sent = dict(zip(SPAN_COLUMNS, rows_for(GraphBatch(spans=[row]), "spans")[0], strict=True))
    assert sent == {**row, **dict.fromkeys(set(BARE) - {"route"})}
