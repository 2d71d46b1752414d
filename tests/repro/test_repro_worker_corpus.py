"""The repro worker on the anomaly corpus's tables (not the sample shop's): the replay's incidents (the daemon's
default configuration, ``tests.corpus.replay``) handed to the worker as the daemon runs it on this checkout, with no
call specs and no copy paths. Where the corpus app's function can be called from the spans (``buy(conn, item)``), the
repro is application level with derived specs, RED against the app and GREEN against a patched copy of its package;
where it cannot (``deposit(conn, account_no, amount)``: the amount is in no statement), the worker says why and the
SQL-level repro is RED and GREEN from the plan's SQL form.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from tests.corpus.repros import prove

pytestmark = pytest.mark.engines


async def test_an_app_level_repro_with_derived_specs_goes_red_then_green(postgres_dsn: str, tmp_path: Path) -> None:
    """The oversell of ``corpus_stock``: ``bench.corpus.apps.invariant_violation:buy`` called with the recorded
    item, the follower fails with ``Oversold`` as in production; the atomic update patched into a copy of ``bench``
    makes the same test pass."""
    event = await prove("invariant_violation", postgres_dsn, tmp_path)
    assert (event.level, event.red.status, event.divergence.faithful) == ("app", "failed", True), event.red
    assert "failed as in production: Oversold" in event.red.failure
    assert "'target': 'bench.corpus.apps.invariant_violation:buy', 'args': [], 'kwargs': {'item': 'item-1'}" in (
        event.test_source
    )
    assert [(r.function, r.strategy) for r in event.repairs] == [("corpus.invariant_violation.buy", "atomic_update")]
    assert event.green is not None and event.green.status == "passed", event.green
    assert event.proven


async def test_a_sql_level_repro_on_a_table_not_in_the_shop_goes_red_then_green(postgres_dsn: str,
                                                                                  tmp_path: Path) -> None:  # fmt: skip
    """The lost update of ``corpus_accounts``: no spec derives (the reason is logged), the SQL-level repro loses the
    leader's deposit, and the row lock's SQL form makes it pass."""
    with capture_logs() as logs:
        event = await prove("lost_update", postgres_dsn, tmp_path)
    [why] = [e for e in logs if e["event"] == "repro.sql_level"]
    assert list(why["reasons"]) == ["corpus.lost_update.deposit"]
    assert why["reasons"]["corpus.lost_update.deposit"].startswith(
        "deposit(): no recorded value for its parameter 'amount'"
    )
    assert (event.level, event.red.status, event.divergence.faithful) == ("sql", "failed", True), event.red
    assert "lost update on corpus_accounts" in event.red.failure
    assert [(r.function, r.strategy) for r in event.repairs] == [("corpus.lost_update.deposit", "row_lock")]
    assert event.green is not None and event.green.status == "passed", event.green
    assert event.proven
