"""The repaired code emits the proof contract's must-start event: a span named after it, one line after the
repaired statement, which the proof judge counts."""

from __future__ import annotations

import types

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from processors.repair.emit_event import EmitError, emit_after_repair, emit_line

BEFORE = '''"""Orders."""

import logging

log = logging.getLogger(__name__)


class Orders:
    def expire(self, cur, order_id):
        """Expire one order."""
        row = cur.execute("SELECT status FROM orders WHERE id = %s", (order_id,))
        if row == "pending":
            cur.execute("UPDATE orders SET status = 'cancelled' WHERE id = %s", (order_id,))
        return row
'''
AFTER = BEFORE.replace(
    'WHERE id = %s", (order_id,))\n        if', 'WHERE id = %s FOR UPDATE", (order_id,))\n        if'
)
EVENT = "trace_repro.fix.b98839ad"


def test_the_line_goes_after_the_repaired_statement() -> None:
    """The emit line follows the statement the repair changed, in its block; the import is added; the rest stays."""
    out = emit_after_repair(AFTER, "shop.orders.Orders.expire", EVENT, before=BEFORE)
    lines = out.splitlines()
    at = lines.index("        " + emit_line(EVENT))
    assert "FOR UPDATE" in lines[at - 1] and lines[at + 1] == '        if row == "pending":'
    assert "import opentelemetry.trace" in lines and out.count(emit_line(EVENT)) == 1
    assert out.replace("        " + emit_line(EVENT) + "\n", "").replace("import opentelemetry.trace\n", "") == AFTER
    assert emit_after_repair(out, "Orders.expire", EVENT, before=BEFORE) == out  # applied twice: once


def test_the_repaired_function_emits_a_span_named_after_the_event() -> None:
    """Run the repaired function: the tracer it reaches records one span named after the event (what the judge
    counts), a child of the request's span."""
    out = emit_after_repair(AFTER, "Orders.expire", EVENT, before=BEFORE)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    module = types.ModuleType("orders_repaired")
    exec(compile(out, "orders_repaired.py", "exec"), module.__dict__)
    cur = types.SimpleNamespace(execute=lambda *_: "paid")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(module.opentelemetry.trace, "get_tracer", lambda name, *a, **k: provider.get_tracer(name))
        with provider.get_tracer("shop").start_as_current_span("POST /orders/expire"):
            assert module.Orders().expire(cur, 7) == "paid"
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {EVENT, "POST /orders/expire"}
    parent = spans[EVENT].parent
    assert parent is not None and parent.span_id == spans["POST /orders/expire"].context.span_id


def test_a_repaired_return_gets_the_line_before_it() -> None:
    """Nothing runs after a return: the line goes before the repaired one."""
    after = BEFORE.replace("        return row\n", "        return row or 'none'\n")
    out = emit_after_repair(after, "expire", EVENT, before=BEFORE)
    assert out.splitlines()[-2:] == ["        " + emit_line(EVENT), "        return row or 'none'"]


def test_a_function_the_repair_did_not_touch_emits_first_thing() -> None:
    """No changed statement in the function (the repair was elsewhere): the line comes first, after the docstring."""
    out = emit_after_repair(BEFORE, "expire", EVENT, before=BEFORE)
    lines = out.splitlines()
    assert lines[lines.index('        """Expire one order."""') + 1] == "        " + emit_line(EVENT)


@pytest.mark.parametrize(("function", "event"), [("nowhere", EVENT), ("expire", 'x"); import os; ("')])
def test_what_cannot_be_emitted_is_refused(function: str, event: str) -> None:
    """An unknown function, or an event name that is not a plain name (it is written into code), is an error."""
    with pytest.raises(EmitError):
        emit_after_repair(AFTER, function, event, before=BEFORE)
