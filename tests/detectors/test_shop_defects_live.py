"""The shop's planted performance defects (``bench.shop.perf``: N+1 queries, a serialized fan-out, a retry storm) on
PostgreSQL, exported by the shop's OpenTelemetry SDK to Kafka, through the shipped ingest stage with the shipped
detector settings: each is found, with its route, remedy and counts, and nothing else is; their fixes (the same
routes with ``clean``) give no finding at all."""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict
from typing import Any

import pytest

from bench.otlp_gen import Generated
from bench.pertrace_benign import run
from bench.shop import perf
from bench.shop.evidence import Summary
from bench.shop.telemetry import CAPTURE_PARAMETERS, start_telemetry
from bench.shop.traffic import CART_ITEMS, PERFORMANCE, WHOLESALE_ITEMS, run_traffic
from processors.detectors.retry_storm import RetryStormConfig
from processors.model.finding import FindingEvent
from streamer.decode import decode_traces_proto
from tests.detectors.shop_spans import messages

pytestmark = pytest.mark.engines

ROUNDS = 4  # requests per buggy scenario; the tax service restarts as every second one comes
# Requests per fixed scenario: enough that the fixed tax client's retries (one per restart, after a backoff) reach
# [retry_storm] min_burst_traces and x1.5 amplification; a third of the attempts fail, so it is no burst.
CONTROL_ROUNDS = 2 * RetryStormConfig().min_burst_traces


async def _messages(bootstrap: str, topic: str, servers: int, timeout_s: float = 60) -> list[bytes]:
    """The topic's messages from the start, until they hold ``servers`` server spans."""
    values, seen = await messages(bootstrap, topic, servers, timeout_s=timeout_s)
    assert seen == servers, (seen, servers)
    return values


def _shop(dsn: str, bootstrap: str, rounds: int, *, clean: bool) -> tuple[dict[str, Summary], list[FindingEvent]]:
    """Every performance scenario (``clean``: their fixes) into a fresh topic, then through a fresh ingest stage."""
    topic = f"shop-defects-{uuid.uuid4().hex[:8]}"
    tel = start_telemetry(bootstrap, topic=topic)
    try:
        runs = {s: run_traffic(dsn, bootstrap, scenario=s, rounds=rounds, clean=clean, telemetry=tel)
                for s in PERFORMANCE}  # fmt: skip
    finally:
        tel.shutdown()
    messages = asyncio.run(_messages(bootstrap, topic, rounds * len(PERFORMANCE)))
    report = run(Generated(messages=messages, spans=sum(len(decode_traces_proto(m)) for m in messages)))
    assert all(c.get("windows_closed") for c in report["counted"].values()), report["counted"]
    assert report["dropped"] == {name: {} for name in report["counted"]}, report["dropped"]
    return runs, report["events"]


def _by_type(events: list[FindingEvent]) -> dict[str, list[dict[str, Any]]]:
    """Each finding type's findings (a run that straddles a window boundary gives one per window) as JSON."""
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        out[e.type].append(e.model_dump(mode="json"))
    return out


def _total(findings: list[dict[str, Any]], key: str) -> int:
    return sum(int(f["data"][key]) for f in findings)


@pytest.mark.parametrize("parameters", [True, False], ids=["parameters", "stock_instrumentation"])
def test_each_planted_defect_is_found_and_its_fix_is_silent(postgres_dsn: str, kafka_bootstrap: str,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            parameters: bool) -> None:  # fmt: skip
    """With the statements' parameters on the spans, and without (stock psycopg instrumentation: the N+1 is then
    N identical-shape statements one after the other)."""
    monkeypatch.setenv(CAPTURE_PARAMETERS, "1" if parameters else "0")
    runs, events = _shop(postgres_dsn, kafka_bootstrap, ROUNDS, clean=False)
    traces = {s: {o.trace_id for o in r.result(s).outcomes} for s, r in runs.items()}
    assert all(len(t) == ROUNDS for t in traces.values()), traces
    stormed = ROUNDS // 2  # every buggy tax quote during a restart gave up on it; the others were served at once
    assert runs["retry_storm"].manifested("retry_storm") == stormed
    traces["retry_storm"] = set(runs["retry_storm"].result("retry_storm").error_traces)
    found = _by_type(events)
    assert set(found) == {"n_plus_one", "serialized_fanout", "retry_storm"}, found.keys()
    for kind, scenario in (("n_plus_one", "n_plus_one"), ("serialized_fanout", "fanout"),
                           ("retry_storm", "retry_storm")):  # fmt: skip
        fs = found[kind]
        assert len({f["fingerprint"] for f in fs}) == 1, fs  # one defect: one fingerprint (across windows)
        assert {t for f in fs for t in f["traces"]} == traces[scenario], kind  # its requests, and only them
        assert _total(fs, "requests") == len(traces[scenario]) and _total(fs, "requests_seen") == ROUNDS, kind

    (n1, *_) = found["n_plus_one"]
    assert n1["remedy"] == "batch_query" and n1["subject"]["operation"] == "/cart/summary"
    assert n1["contract"]["routes"] == ["/cart/summary"]
    assert n1["data"]["route"] == "/cart/summary" and n1["data"]["db_system"] == "postgresql"
    assert n1["data"]["parent_operation"] == "shop.perf.cart_summary"
    assert "inventory" in n1["data"]["statement_shape"] and n1["data"]["with_parameters"] is parameters
    assert n1["data"]["max_per_request"] == WHOLESALE_ITEMS
    assert _total(found["n_plus_one"], "statements") == ROUNDS * WHOLESALE_ITEMS

    (fan, *_) = found["serialized_fanout"]
    assert fan["remedy"] == "parallelize_calls" and fan["data"]["route"] == "/cart/shipping-quote"
    assert (fan["data"]["dependency"], fan["data"]["operation"]) == ("POST /rates", "POST /rates")
    assert (fan["data"]["max_calls"], fan["data"]["max_concurrency"]) == (CART_ITEMS, 1)
    assert fan["data"]["saving_ms_max"] >= (CART_ITEMS - 1) * perf.RATE_S * 1000

    (storm, *_) = found["retry_storm"]
    assert storm["remedy"] == "backoff_with_jitter" and storm["data"]["route"] == "/cart/tax"
    assert (storm["data"]["dependency"], storm["data"]["operation"]) == ("POST /tax/quote", "POST /tax/quote")
    assert storm["data"]["within_trace"] is True and storm["data"]["max_attempts"] == perf.ATTEMPTS
    assert _total(found["retry_storm"], "attempts") == stormed * perf.ATTEMPTS + (ROUNDS - stormed)
    assert _total(found["retry_storm"], "logical_calls") == ROUNDS
    assert _total(found["retry_storm"], "exhausted") == stormed

    fixed, silent = _shop(postgres_dsn, kafka_bootstrap, CONTROL_ROUNDS, clean=True)
    assert all(o.status == 200 for s, r in fixed.items() for o in r.result(s).outcomes)
    retried = [o for o in fixed["retry_storm"].result("retry_storm").outcomes if o.result and o.result["attempts"] > 1]
    assert len(retried) == CONTROL_ROUNDS // 2  # the fix retried through every restart, once
    assert silent == [], _by_type(silent)
