"""An oversell judged under ``stock >= 0`` while the row's images hold hostile values, through both stages.

The row's history holds, before the oversell, a stock that is not a number (``NaN``, ``Infinity``, ``sNaN``, 5000
digits, a megabyte string, a struct ...) and every image an extra hostile column. Judging such a value raised in the
middle of the collision detector's step (decimal.InvalidOperation): the oversell was never reported and its pins
stayed. Properties: no processor hook raises, the oversell is reported once as an invariant violation showing the
``-1``, and every consumed position ends committable.
"""

from __future__ import annotations

import json
import random
from typing import Any

from hypothesis import strategies as st

from tests.fuzz.profiles import fuzz
from tests.fuzz.strategies import ROW_VALUES, constants, row_values
from tests.runtime.chain import INVENTORY_CDC, MS, SPANS, T0, Chain, S, Scenario

ENV = {
    "TRACE_REPRO_WINDOWS__TRACE_GAP_S": "0.2",
    "TRACE_REPRO_WINDOWS__IDLE_S": "0.3",
    "TRACE_REPRO_COLLISIONS__INVARIANTS": json.dumps({"inventory": ["stock >= 0", "NOT stock < 0 OR note IS NULL"]}),
}
READ, TAKE = "SELECT stock FROM inventory WHERE sku = %s", "UPDATE inventory SET stock = stock - 1 WHERE sku = %s"


def hostile_oversell(scenario: Scenario, sku: str, at_ns: int, stock: Any, note: Any) -> None:
    """``Scenario.oversell`` with a hostile past: the row is created with ``stock`` (not a number), restocked to 1,
    then two checkouts both take the unit; every image carries ``note``."""
    scenario._debezium(
        "inventory", None, {"sku": sku, "stock": stock, "note": note}, at_ns - 80 * MS, "", key_column="sku"
    )
    scenario._debezium(
        "inventory",
        {"sku": sku, "stock": stock, "note": note},
        {"sku": sku, "stock": 1, "note": note},
        at_ns - 50 * MS,
        "",
        key_column="sku",
    )
    for n, function in enumerate(("shop.handlers.checkout", "shop.handlers.checkout_again")):
        scenario._request(
            function,
            "/checkout",
            at_ns + n * MS,
            [(READ, f"('{sku}',)", 0, MS), (TAKE, f"('{sku}',)", 10 * MS, (1 + 3 * n) * MS)],
        )
    for before, after, at in ((1, 0, 11 * MS + MS // 2), (0, -1, 15 * MS)):
        scenario._debezium(
            "inventory",
            {"sku": sku, "stock": before, "note": note},
            {"sku": sku, "stock": after, "note": note},
            at_ns + at,
            "",
            key_column="sku",
        )


_STOCKS = constants(
    [
        "NaN",
        "Infinity",
        "-Infinity",
        "sNaN",
        "1e999999999",
        "9" * 5_000,
        "x" * 70_000,
        "nan",
        {"scale": 2, "value": "AQ=="},
        [],
        None,
        "-0",
        "\x00",
        True,
    ]
)


@fuzz(
    _STOCKS,
    st.one_of(constants(ROW_VALUES), row_values(surrogates=False)),
    st.integers(0, 2**32 - 1),
    examples=30,
    long_examples=5_000,
)
def test_an_oversell_is_found_whatever_the_rows_past_holds(stock: Any, note: Any, seed: int) -> None:
    """See the module docstring."""
    scenario = Scenario()
    hostile_oversell(scenario, "sku-1", T0 + S, stock, note)
    chain = Chain(ENV, owners=[((SPANS, 0), (INVENTORY_CDC, 0))])
    found = chain.run(scenario, random.Random(seed), wall_step_s=0.5, polls=True)
    errors = {t.component: t.dropped["error"] for t in chain.metrics.telemetry.all() if t.dropped.get("error")}
    assert errors == {}
    assert [(e["entity"], e["anomaly"]) for e in found.incidents] == [("inventory:sku-1", "invariant_violation")]
    assert "stock = -1 violates stock >= 0" in found.incidents[0]["damage"]
    assert chain.committable_everywhere()
