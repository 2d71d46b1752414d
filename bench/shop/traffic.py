"""Concurrent traffic against the shop: each round is one independent collision opportunity on a fresh row.

The contending requests of a round run in their own threads and are released together by a
``threading.Barrier`` at their race point (``bench.shop.race``), right before the conflicting step. No sleep
orders anything: which request wins is decided by PostgreSQL's row locks and the scheduler.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial

from bench.shop import db, evidence, handlers, invoices, jobs, perf, reports, shipping
from bench.shop.downstream import HttpClient, Outage
from bench.shop.evidence import ScenarioResult, Summary
from bench.shop.race import racing
from bench.shop.service import Outcome, Shop
from bench.shop.telemetry import Telemetry, start_telemetry

KINDS = ("lost_update", "oversell", "double_charge")
# A performance defect beside the concurrency ones, run on its own (not in ``all``): ``bench.shop.shipping``.
BLOCKED_BY = "blocked_by"
# Performance defects of one request each, also on their own (``bench.shop.perf``): ``clean`` runs their fixes.
PERFORMANCE = ("n_plus_one", "fanout", "retry_storm")
# Performance defects, each on its own too: a query with no timeout (``bench.shop.reports``) and a shop-wide lock
# held across slow work (``bench.shop.invoices``). Their fixed builds (from ``shipping.FIXED_IN``) are the controls.
HANG, CONTENTION = "hang", "contention"
VERSIONED = (BLOCKED_BY, HANG, CONTENTION)  # scenarios whose fix ships in a release (run by version)
SCENARIOS = (*KINDS, *VERSIONED, *PERFORMANCE, "control", "all")
AMOUNT = 4200
DISCOUNT = 500  # cents
WAITED_MS = 100  # an UPDATE this slow waited on the row lock (the round manifested)
# A safety net for a contender that never reaches its race point (e.g. blocked on a row lock that its rival holds
# while waiting at the barrier, once the code is repaired), not a pacing device.
BARRIER_TIMEOUT_S = float(os.environ.get("SHOP_BARRIER_TIMEOUT_S", "10"))
# hang: reports before the stall, one at a time, a trickle (paced) for at least STEADY_S and STEADY calls: a hop's
# recent distribution needs 100 calls, at most a sample of each window's
STEADY, STEADY_S, STEADY_PACE_S = 150, 3.5, 0.01
BURSTS = (1, 2, 4, 6)  # contention: invoices in flight together, cycled through so every stretch mixes levels
STAGGER_S = 0.005  # between two starts of a burst: clients arrive one after another, not in one instant


def race(*calls: Callable[[], Outcome]) -> list[Outcome]:
    """Run ``calls`` in parallel threads, released together at their race points."""
    barrier = threading.Barrier(len(calls))
    outcomes: list[Outcome | None] = [None] * len(calls)

    def contender(i: int) -> None:
        waited = False

        def at_race_point() -> None:
            nonlocal waited
            if not waited:
                waited = True
                with contextlib.suppress(threading.BrokenBarrierError):  # a contender ended before its race point
                    barrier.wait(BARRIER_TIMEOUT_S)

        with racing(at_race_point):
            try:
                outcomes[i] = calls[i]()
            finally:
                if not waited:
                    barrier.abort()

    threads = [threading.Thread(target=contender, args=(i,), name=f"shop-contender-{i}") for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [o for o in outcomes if o is not None]


def lost_update(shop: Shop, dsn: str, rounds: int) -> ScenarioResult:
    """capture_payment vs the expire_cart job on a fresh 'pending' order."""
    ids = db.seed_orders(dsn, rounds, amount=AMOUNT)
    outcomes: list[Outcome] = []
    for o in ids:
        capture = partial(shop.request, "POST", "/orders/{order_id}/capture", f"/orders/{o}/capture",
                          handlers.capture_payment, o, f"cap-{o}", idempotency_key=f"cap-{o}")  # fmt: skip
        outcomes += race(capture, partial(shop.job, jobs.expire_cart, o))
    return ScenarioResult("lost_update", shop.clean, rounds, evidence.lost_updates(dsn, ids), outcomes, ids)


def oversell(shop: Shop, dsn: str, rounds: int) -> ScenarioResult:
    """Two checkouts of the last unit of a fresh sku."""
    tag = uuid.uuid4().hex[:8]
    skus = db.seed_skus(dsn, [f"sku-{tag}-{i}" for i in range(rounds)], stock=1)
    outcomes: list[Outcome] = []
    for sku in skus:
        buyer = partial(shop.request, "POST", "/checkout", "/checkout", handlers.checkout, sku)
        outcomes += race(buyer, buyer)
    return ScenarioResult("oversell", shop.clean, rounds, evidence.oversold(dsn, skus), outcomes, skus)


def double_charge(shop: Shop, dsn: str, rounds: int) -> ScenarioResult:
    """A client retry racing the original charge request, same idempotency key, fresh order."""
    ids = db.seed_orders(dsn, rounds, amount=AMOUNT)
    outcomes: list[Outcome] = []
    for o in ids:
        key = f"pay-{o}-{uuid.uuid4().hex[:6]}"
        attempt = partial(shop.request, "POST", "/orders/{order_id}/charges", f"/orders/{o}/charges", handlers.charge,
                          o, AMOUNT, key, idempotency_key=key)  # fmt: skip
        outcomes += race(attempt, attempt)
    return ScenarioResult("double_charge", shop.clean, rounds, evidence.double_charges(dsn, ids), outcomes, ids)


def blocked_by(shop: Shop, dsn: str, rounds: int) -> ScenarioResult:
    """ship_order (holding the order's row lock across the carrier's booking, unless fixed) vs apply_discount on a
    fresh order; the discount's UPDATE waits for ship_order's commit."""
    ids = db.seed_orders(dsn, rounds, amount=AMOUNT)
    outcomes: list[Outcome] = []
    for o in ids:
        ship = partial(shop.request, "POST", "/orders/{order_id}/ship", f"/orders/{o}/ship", shipping.ship_order, o)
        discount = partial(shop.request, "POST", "/orders/{order_id}/discount", f"/orders/{o}/discount",
                           shipping.apply_discount, o, DISCOUNT)  # fmt: skip
        outcomes += race(ship, discount)
    waited = [o for o in outcomes if o.result and o.result.get("update_ms", 0) >= WAITED_MS]
    return ScenarioResult(BLOCKED_BY, shop.clean, rounds, {"manifested": len(waited)}, outcomes, ids)


CART_ITEMS = 12  # skus per cart (parcels, for the shipping quote and the tax quote)
# Lines of the wholesale carts whose summary runs one query per line: on a local database a lookup by key takes a
# fraction of a millisecond, so a loop costs what the N+1 detector reports (``[n_plus_one] min_repeated_ms``)
# only over a large order; a production database, a network away, makes a small one cost as much.
WHOLESALE_ITEMS = 400


def _carts(dsn: str, rounds: int, items: int = CART_ITEMS) -> list[list[str]]:
    """``rounds`` carts of ``items`` fresh skus in stock."""
    tag = uuid.uuid4().hex[:8]
    skus = db.seed_skus(dsn, [f"sku-{tag}-{i}" for i in range(rounds * items)], stock=3)
    return [skus[i : i + items] for i in range(0, len(skus), items)]


def _perf(name: str, shop: Shop, carts: list[list[str]], outcomes: list[Outcome], manifested: int) -> ScenarioResult:
    return ScenarioResult(name, shop.clean, len(carts), {"manifested": manifested}, outcomes,
                          [s for cart in carts for s in cart])  # fmt: skip


def n_plus_one(shop: Shop, dsn: str, rounds: int) -> ScenarioResult:
    """A cart summary per fresh wholesale cart: one stock query per item (buggy) or one for the cart (clean)."""
    carts = _carts(dsn, rounds, WHOLESALE_ITEMS)
    outcomes = [shop.request("POST", "/cart/summary", "/cart/summary", perf.cart_summary, c) for c in carts]
    done = sum(1 for o in outcomes if o.status == 200)
    return _perf("n_plus_one", shop, carts, outcomes, 0 if shop.clean else done)


def fanout(shop: Shop, dsn: str, rounds: int) -> ScenarioResult:
    """A shipping quote per fresh cart: one rate call per parcel, one after the other (buggy) or all at once."""
    carts = _carts(dsn, rounds)
    carrier = HttpClient(shop.tracer, "rates.carrier.example")
    outcomes = [shop.request("POST", "/cart/shipping-quote", "/cart/shipping-quote", perf.shipping_quote, c,
                             carrier) for c in carts]  # fmt: skip
    done = sum(1 for o in outcomes if o.status == 200)
    return _perf("fanout", shop, carts, outcomes, 0 if shop.clean else done)


def retry_storm(shop: Shop, dsn: str, rounds: int) -> ScenarioResult:
    """A tax quote per fresh cart; the tax service restarts as every second one comes (and is up for the others):
    immediate retries until they run out (buggy), or one retry after a backoff (clean). Manifested: requests that
    failed after retrying."""
    carts = _carts(dsn, rounds)
    tax, outage = HttpClient(shop.tracer, "tax.example"), Outage()
    outcomes: list[Outcome] = []
    for i, cart in enumerate(carts):
        if i % 2 == 0:
            outage.begin(perf.OUTAGE_S)
        else:
            outage.end()  # up again
        outcomes.append(shop.request("POST", "/cart/tax", "/cart/tax", perf.cart_tax, cart, tax, outage))
    return _perf("retry_storm", shop, carts, outcomes, sum(1 for o in outcomes if o.status == 503))


def at_once(calls: list[Callable[[], Outcome]], stagger_s: float = 0.0) -> list[Outcome]:
    """Run ``calls`` in parallel threads, started ``stagger_s`` apart; their outcomes in start order."""
    outcomes: list[Outcome | None] = [None] * len(calls)

    def client(i: int) -> None:
        outcomes[i] = calls[i]()

    threads = [threading.Thread(target=client, args=(i,), name=f"shop-client-{i}") for i in range(len(calls))]
    for t in threads:
        t.start()
        time.sleep(stagger_s)
    for t in threads:
        t.join()
    return [o for o in outcomes if o is not None]


def hang(shop: Shop, dsn: str, rounds: int) -> ScenarioResult:
    """Sales reports one after another (``STEADY``, ``STEADY_S``), then ``rounds`` at once while the database
    stalls: the buggy ones wait the whole stall and answer 200 (manifested: timed, so that a stall that did not
    happen is not counted), the fixed ones fail fast (504)."""
    report = partial(shop.request, "GET", reports.ROUTE, reports.ROUTE, reports.sales_report, "paid")
    outcomes: list[Outcome] = []
    until = time.monotonic() + STEADY_S
    while len(outcomes) < STEADY or time.monotonic() < until:
        outcomes.append(report())
        time.sleep(STEADY_PACE_S)
    waited: list[float] = []  # the stalled reports that answered 200 after the whole stall (appended by threads)

    def stalled_report() -> Outcome:
        start = time.monotonic()
        outcome = report()
        if outcome.status == 200 and (took := time.monotonic() - start) >= reports.STALL_S:
            waited.append(took)
        return outcome

    with reports.stalled(reports.STALL_S):
        stalled = at_once([stalled_report] * rounds)
    return ScenarioResult(HANG, shop.clean, rounds, {"manifested": len(waited), "stalled": len(stalled)},
                          outcomes + stalled, [])  # fmt: skip


def contention(shop: Shop, dsn: str, rounds: int) -> ScenarioResult:
    """``rounds`` invoices of fresh orders in staggered bursts of ``BURSTS`` in flight together; an invoice that
    waited for the invoicing lock at least one rendering's time queued behind another (manifested)."""
    ids = db.seed_orders(dsn, rounds, amount=AMOUNT)
    outcomes: list[Outcome] = []
    i = 0
    while i < len(ids):
        for size in BURSTS:
            burst = ids[i : i + size]
            i += len(burst)
            outcomes += at_once([partial(shop.request, "POST", invoices.ROUTE, f"/orders/{o}/invoice",
                                         invoices.issue_invoice, o) for o in burst], STAGGER_S)  # fmt: skip
    queued = [o for o in outcomes if o.result and o.result["lock_wait_ms"] >= invoices.RENDER_S * 1000]
    return ScenarioResult(CONTENTION, shop.clean, rounds, {"manifested": len(queued)}, outcomes, ids)


ROUNDS: dict[str, Callable[[Shop, str, int], ScenarioResult]] = {
    "lost_update": lost_update,
    "oversell": oversell,
    "double_charge": double_charge,
    BLOCKED_BY: blocked_by,
    "n_plus_one": n_plus_one,
    "fanout": fanout,
    "retry_storm": retry_storm,
    HANG: hang,
    CONTENTION: contention,
}


def run_traffic(
    dsn: str,
    kafka_bootstrap: str,
    *,
    scenario: str,
    rounds: int,
    version: str = "1.0.0",
    clean: bool = False,
    topic: str = "otlp_spans",
    environment: str = "bench",
    revision: str = "local",
    telemetry: Telemetry | None = None,
) -> Summary:
    """Apply the schema, run ``rounds`` rounds of ``scenario`` and flush the spans to ``topic``.

    ``control`` is ``all`` on the clean variants. Spans go to a fresh exporter unless ``telemetry`` is given
    (then it is flushed, not shut down). ``blocked_by`` runs its fix from the release that ships it
    (``shipping.fixed``), as well as with ``clean``; the performance scenarios (``PERFORMANCE``) run theirs with
    ``clean``.
    (``shipping.fixed``), as well as with ``clean``, and so do ``hang`` and ``contention``.
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}: one of {', '.join(SCENARIOS)}")
    kinds = KINDS if scenario in ("all", "control") else (scenario,)
    clean = clean or scenario == "control" or (scenario in VERSIONED and shipping.fixed(version))
    db.apply_schema(dsn)
    tel = telemetry or start_telemetry(kafka_bootstrap, topic=topic, version=version, environment=environment,
                                       revision=revision)  # fmt: skip
    try:
        shop = Shop(dsn, tel.tracer, clean=clean)
        results = [ROUNDS[kind](shop, dsn, rounds) for kind in kinds]
    finally:
        if telemetry is None:
            tel.shutdown()
        else:
            tel.flush()
    return Summary(version, topic if telemetry is None else telemetry.exporter.topic, results)
