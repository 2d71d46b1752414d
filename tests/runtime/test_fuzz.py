"""No poison pill: over 10^5 generated bad inputs on every input topic of both stages, nothing stops either stage.

Each example mutates real messages of every kind the stages read (OTLP protobuf spans and logs, Debezium JSON, the
incidents and contracts topics, the internal topic's accesses, row changes, watermarks and relays): byte flips,
truncations, garbage, JSON values of the wrong type, lone surrogates in keys, tables and transaction ids, huge and
negative numbers. Both stages must process every batch without raising, send what they cannot use to the DLQ with
a reason and its position, and keep committing: once the input stops and event time moves on, every position is
committable.
"""

from __future__ import annotations

import json
import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.logs.v1.logs_pb2 import LogsData

from processors.detectors.regressions.shares import shares
from processors.detectors.regressions.stats import ServiceStats
from processors.model.events import Access, CdcOp, DbOperation, LockMode, Relay, RowChange
from streamer.decode import internal as wire
from streamer.decode.registry import Record
from tests.regressions.builders import access as evidence_access
from tests.regressions.builders import incident, request
from tests.runtime.chain import CDC, MS, SPANS, T0, Chain, Scenario

PER_EXAMPLE = 1_000
EXAMPLES = 100  # 10^5 inputs in all

_scenario = Scenario()
_scenario.lost_update(1, T0 + 1_000 * MS)
SPAN_MESSAGES = [v for _, v in _scenario.spans]
CDC_MESSAGES = [(k, v) for _, k, v, _ in _scenario.changes]
EVENT = incident(evidence_access("1.0", "f", "/r", at_ms=T0 / MS), evidence_access("1.0", "g", "/r", at_ms=T0 / MS))
ACCESS = Access(entity="orders:1", table="orders", operation=DbOperation.WRITE, lock=LockMode.NONE, trace_id="a" * 32,
                span_id="b" * 16, service="shop", version="1", start_ns=T0, end_ns=T0 + MS, statement="UPDATE x",
                set_values=(("status", "paid"),))  # fmt: skip
CHANGE = RowChange(table="public.orders", op=CdcOp.UPDATE, key=(("id", 1),), before={"status": "a"},
                   after={"status": "b"}, commit_ts_ms=T0 // MS, ts_ms=T0 // MS, lsn=9, tx_id="7")  # fmt: skip
WEIRD: list[Any] = ["\ud800", "x\udfff", 2**64, -(2**63) - 1, 1e308, -1, "", None, [], {}, [1, [2, [3]]],
                    {"a": {"b": "\ud83d"}}, True, "9" * 400]  # fmt: skip


def _flip(data: bytes, rnd: random.Random) -> bytes:
    choice = rnd.randrange(4)
    if choice == 0 and data:
        i = rnd.randrange(len(data))
        return data[:i] + bytes([rnd.randrange(256)]) + data[i + 1 :]
    if choice == 1:
        return data[: rnd.randrange(len(data) + 1)]
    if choice == 2:
        return rnd.randbytes(rnd.randrange(64))
    i = rnd.randrange(len(data) + 1)
    return data[:i] + rnd.randbytes(rnd.randrange(1, 8)) + data[i:]


def _mutate(doc: Any, rnd: random.Random, depth: int = 0) -> Any:
    """The JSON document with one value somewhere replaced by something of the wrong type."""
    if isinstance(doc, dict) and doc and depth < 6:
        key = rnd.choice(list(doc))
        out = dict(doc)
        if rnd.random() < 0.15:
            del out[key]
        elif rnd.random() < 0.5:
            out[key] = _mutate(doc[key], rnd, depth + 1)
        else:
            out[key] = rnd.choice(WEIRD)
        return out
    if isinstance(doc, list) and doc and depth < 6:
        i = rnd.randrange(len(doc))
        return [*doc[:i], _mutate(doc[i], rnd, depth + 1), *doc[i + 1 :]]
    return rnd.choice(WEIRD)


def _json_bytes(doc: Any, rnd: random.Random) -> bytes:
    text = json.dumps(_mutate(doc, rnd), ensure_ascii=True)
    return text.encode() if rnd.random() < 0.9 else _flip(text.encode(), rnd)


def _share() -> Relay:
    """A regression-statistics share of a window with one request of each outcome (the judge's input)."""
    stats = ServiceStats(60_000 * MS, 10_000 * MS)
    stats.add(request(T0 - T0 % (60_000 * MS), "1.0", exception="RoundingError"))
    stats.add(request(T0 - T0 % (60_000 * MS), "1.0"))
    [window] = stats.close_until(T0 + 3_600_000 * MS)
    [relay] = shares(window)
    return relay


RELAY = _share()


def _bad_inputs(chain: Chain, rnd: random.Random) -> list[tuple[str, bytes | None, bytes | None]]:
    k = chain.settings.kafka
    out: list[tuple[str, bytes | None, bytes | None]] = []
    for _ in range(PER_EXAMPLE):
        kind = rnd.randrange(7)
        if kind == 0:
            out.append((SPANS, None, _flip(rnd.choice(SPAN_MESSAGES), rnd)))
        elif kind == 1:
            out.append((k.logs_topic, None, _flip(rnd.choice(SPAN_MESSAGES), rnd)))
        elif kind == 2:
            key, value = rnd.choice(CDC_MESSAGES)
            mutated_key = _json_bytes(json.loads(key), rnd) if rnd.random() < 0.3 else key
            out.append((CDC, mutated_key, _json_bytes(json.loads(value), rnd)))
        elif kind == 3:
            out.append((k.incidents_topic, None, _json_bytes(json.loads(EVENT.model_dump_json()), rnd)))
        elif kind == 4:
            out.append((k.contracts_topic, None, _json_bytes({"kind": "contract", "signature": "x:y:z"}, rnd)))
        else:
            good = [wire.encode_access(ACCESS), wire.encode_row_change(CHANGE),
                    wire.encode_watermark(wire.Watermark(T0, ("otlp_spans/0",))), wire.encode_relay(RELAY)]  # fmt: skip
            key = rnd.choice([b"orders:1", b"\xff\xfe", None, "\ud800".encode("utf-8", "surrogatepass")])
            out.append((k.accesses_topic, key, _json_bytes(json.loads(rnd.choice(good)), rnd)))
    return out


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_bad_input_never_stops_either_stage_nor_its_commits(seed: int) -> None:
    """A thousand bad messages over every input topic: no exception escapes, and every position becomes
    committable (bad input is dead-lettered or ignored, never pinned forever)."""
    rnd = random.Random(seed)
    chain = Chain({})
    chain.ingest.assign([(chain.settings.kafka.logs_topic, 0)])
    internal_topic = chain.settings.kafka.accesses_topic
    inputs = _bad_inputs(chain, rnd)
    dead = 0
    for i in range(0, len(inputs), 50):
        first, second = [], []
        for topic, key, value in inputs[i : i + 50]:
            partition = rnd.randrange(2) if topic == internal_topic else 0
            record = chain._record(topic, partition, key, value)
            (second if topic == internal_topic else first).append(record)
        out = chain.ingest.process(first)
        chain.ingest.release(out.release)
        dead += sum(1 for m in out.produce if m.topic == chain.settings.kafka.dlq_topic)
        chain._entities(second)
    for _ in range(30):  # input stops: stage 1's event time catches up past its 60 s windows; stage 2 follows
        chain.clock.advance(4.0)
        chain._step([])
    for partition in range(2):
        chain._entities(
            [
                chain._record(
                    internal_topic, partition, None, wire.encode_watermark(wire.Watermark(T0 + 10**12, (f"{SPANS}/0",)))
                )
            ]
        )
    assert dead > 0
    assert chain.committable_everywhere()
    assert chain.ingest.committable((CDC, 0), chain.offsets[(CDC, 0)]) == chain.offsets[(CDC, 0)]


def test_a_record_whose_handling_raises_goes_to_the_dlq_with_its_position() -> None:
    """Anything a handler raises beyond a decode error dead-letters that one record (reason internal_error:<type>)
    and the batch goes on."""
    chain = Chain({})

    def boom(record: Record, events: Any, out: Any) -> None:
        raise KeyError("a bug")

    chain.ingest.handlers["logs"] = boom
    good = chain._record(SPANS, 0, None, SPAN_MESSAGES[0])
    bad = chain._record(chain.settings.kafka.logs_topic, 0, None, b"")
    out = chain.ingest.process([bad, good])
    [dead] = [m for m in out.produce if m.topic == chain.settings.kafka.dlq_topic]
    headers = dict(dead.headers)
    assert headers["reason"] == b"empty_value"  # a decode error first: the logs decoder refuses an empty value
    logs = LogsData()
    logs.resource_logs.add().scope_logs.add().log_records.add(body={"string_value": "hello"})
    bad = chain._record(chain.settings.kafka.logs_topic, 0, None, logs.SerializeToString())
    out = chain.ingest.process([bad])
    [dead] = [m for m in out.produce if m.topic == chain.settings.kafka.dlq_topic]
    assert dict(dead.headers)["reason"] == b"internal_error:KeyError"
    assert dict(dead.headers)["source.offset"] == b"1"
    assert len(chain.ingest.traces) == 1  # the good message before it was processed
