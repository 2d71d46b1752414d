"""The N+1 detector on planted loops and on controls that must stay silent."""

from __future__ import annotations

from processors.api.telemetry import Telemetry
from processors.detectors.n_plus_one import NPlusOneConfig, NPlusOneData, NPlusOneDetector
from processors.findings.trace_windows import statement_shape
from processors.model.finding import data_of
from tests.detectors.trace_kit import GAP_NS, MS, T0, WINDOW_NS, Request, close_all

ITEM = "SELECT id, name, price FROM items WHERE id = %s"


def detector(**config: object) -> NPlusOneDetector:
    return NPlusOneDetector(NPlusOneConfig(**config), WINDOW_NS, GAP_NS, telemetry=Telemetry("n_plus_one_test"))  # type: ignore[arg-type]


def looping(i: int, items: int = 20, *, version: str = "1.0.0", params: bool = True, gap_ms: float = 0.5) -> Request:
    """GET /orders/{id}: the order, then one SELECT per item, one after the other (the planted N+1)."""
    r = Request("/orders/{id}", T0 + i * 100 * MS, version=version)
    r.db("SELECT id, total FROM orders WHERE id = %s", 1, 2, (i,))
    at = 3.0
    for k in range(items):
        r.db(ITEM, at, 3, (1000 * i + k,) if params else ())
        at += 3 + gap_ms
    return r


def test_planted_loop_is_one_finding_with_count_share_and_remedy() -> None:
    """Thirty requests each running the item query twenty times in a loop: one finding for the route, with the
    count, the share of the critical path, the chart, a batch_query remedy and the contract's signature."""
    d = detector()
    for i in range(30):
        d.on_trace(looping(i).trace(), ())
    for i in range(30, 40):  # the same route without the loop (an order with one item) still counts as traffic
        r = Request("/orders/{id}", T0 + i * 100 * MS)
        r.db(ITEM, 1, 3, (i,))
        d.on_trace(r.trace(), ())
    [finding] = close_all(d)
    data = data_of(finding, NPlusOneData)
    assert finding.type == "n_plus_one" and finding.remedy == "batch_query"
    assert data.statement_shape == "select id, name, price from items where id = ?"
    assert (data.requests, data.requests_seen, data.max_per_request, data.statements) == (30, 40, 20, 600)
    assert data.with_parameters and data.parent_operation == "shop.views.handler"
    assert 0.75 < data.critical_path_share_mean <= 1.0  # 20 x 3 ms of a ~73 ms request
    assert finding.severity == "high"
    assert finding.contract is not None
    assert finding.contract.signature == f"finding:n_plus_one:{finding.fingerprint}"
    assert finding.contract.routes == ["/orders/{id}"] and finding.contract.baseline_rate == 0.75
    [series] = finding.series
    assert len(series.points) == 30 and {p.y for p in series.points} == {20}
    assert any("critical path" in line for line in finding.evidence)


def test_stock_instrumentation_without_parameters_is_found() -> None:
    """Without parameters (stock instrumentation), N identical-shape sequential statements under one parent count."""
    d = detector()
    d.on_trace(looping(1, params=False).trace(), ())
    [finding] = close_all(d)
    assert not data_of(finding, NPlusOneData).with_parameters


def test_inlined_literals_share_a_shape() -> None:
    """Statements that inline their values (no placeholders) are one shape: the loop is found."""
    d = detector()
    r = Request("/cart", T0)
    for k in range(8):
        r.db(f"SELECT * FROM items WHERE id = {k} AND sku = 'S-{k}'", 1 + 4 * k, 3)
    d.on_trace(r.trace(), ())
    [finding] = close_all(d)
    assert data_of(finding, NPlusOneData).statement_shape == "select * from items where id = ? and sku = ?"


def test_fingerprint_is_stable_across_deploys() -> None:
    """The same loop in the next build has the same fingerprint (service, route, shape: no version)."""
    a, b = detector(), detector()
    a.on_trace(looping(1, version="1.0.0").trace(), ())
    b.on_trace(looping(2, version="1.1.0").trace(), ())
    [fa], [fb] = close_all(a), close_all(b)
    assert fa.fingerprint == fb.fingerprint and fa.subject.version != fb.subject.version


def test_controls_stay_silent() -> None:
    """A batched query, a loop below the threshold, concurrent statements, one lookup repeated with the same value
    and a loop too fast to matter: no finding."""
    d = detector()
    batched = Request("/orders/{id}", T0)
    batched.db("SELECT id, name FROM items WHERE id = ANY(%s)", 1, 5, ((1, 2, 3),))
    d.on_trace(batched.trace(), ())
    d.on_trace(looping(1, items=4).trace(), ())
    concurrent = Request("/orders/{id}", T0 + MS)
    for k in range(20):
        concurrent.db(ITEM, 1 + 0.1 * k, 5, (k,))
    d.on_trace(concurrent.trace(), ())
    same = Request("/orders/{id}", T0 + 2 * MS)
    for k in range(20):
        same.db(ITEM, 1 + 4 * k, 3, (7,))
    d.on_trace(same.trace(), ())
    fast = Request("/orders/{id}", T0 + 3 * MS)
    for k in range(20):
        fast.db(ITEM, 1 + 0.2 * k, 0.1, (k,))
    d.on_trace(fast.trace(), ())
    assert close_all(d) == []


def test_write_loop_gets_bulk_write() -> None:
    """An INSERT per item is a write loop: remedy bulk_write."""
    d = detector()
    r = Request("/import", T0, method="POST")
    for k in range(10):
        r.db("INSERT INTO lines (order_id, sku) VALUES (%s, %s)", 1 + 4 * k, 3, (1, f"s{k}"))
    d.on_trace(r.trace(), ())
    [finding] = close_all(d)
    assert finding.remedy == "bulk_write"


def test_fingerprint_bound_is_counted() -> None:
    """Past max_fingerprints per window, a new loop is dropped and counted, never kept without bound."""
    d = detector(max_fingerprints=1)
    for n, table in enumerate(("items", "lines")):
        r = Request("/orders/{id}", T0 + n * MS)
        for k in range(6):
            r.db(f"SELECT * FROM {table} WHERE id = %s", 1 + 4 * k, 4, (k,))
        d.on_trace(r.trace(), ())
    assert len(close_all(d)) == 1
    assert d.telemetry.dropped["max_fingerprints"] == 1


def test_statement_shape_masks_values_and_folds_lists() -> None:
    """Shapes mask strings, numbers and placeholders, fold IN lists and VALUES rows, and keep names with digits."""
    assert statement_shape("SELECT a1 FROM t2 WHERE x IN (1, 2, 3) AND y = 'it''s'") == (
        "select a1 from t2 where x in (?) and y = ?"
    )
    assert statement_shape("INSERT INTO t (a, b) VALUES ($1, $2), ($3, $4);") == "insert into t (a, b) values (?)"
    assert statement_shape("select * from t where id = :id") == statement_shape("SELECT *  FROM t WHERE id = ?")
