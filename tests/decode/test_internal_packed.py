"""Accesses packed on the internal topic (``streamer.decode.internal.pack_accesses``): one message per partition of a
batch, read back as the accesses sent alone read, placed where each access's key would have sent it alone, bounded in
size, and read the checked way when another version of stage 1 wrote the fields."""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from typing import Any

import pytest
from aiokafka.partitioner import DefaultPartitioner
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.model.events import ACCESS_FIELDS, Access, DbOperation, LockMode
from streamer.decode import internal
from streamer.decode.strings import SharedStrings
from tests.decode.test_internal_fast import _canon
from tests.test_wire import accesses

ACCESS = Access("orders:8812", "orders", DbOperation.WRITE, LockMode.NONE, "t" * 32, "s" * 16, "shop", "1.0",
                1, 2, "UPDATE orders SET status = %s WHERE id = %s", params=("paid", 8812))  # fmt: skip


def _alone(batch: list[Access]) -> list[Any]:
    """The accesses as stage 2 reads them sent one message each (the form packing replaces)."""
    return [_canon(internal.decode(internal.encode_access(a))) for a in batch]


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=64))
def test_a_packed_access_goes_to_the_partition_its_key_would_have_gone_to_alone(key: bytes, partitions: int) -> None:
    """The producer sends a keyed row change to its default partitioner's choice: the row's accesses go there too."""
    every = list(range(partitions))
    assert internal.partition_of(key, partitions) == DefaultPartitioner()(key, every, every)


@settings(max_examples=60, deadline=None)
@given(st.lists(accesses, min_size=1, max_size=12))
def test_packed_accesses_read_back_as_the_accesses_sent_alone(batch: list[Access]) -> None:
    packed = internal.encode_accesses(batch)
    assert packed.startswith(internal.PACKED_PREFIX)
    assert [_canon(a) for a in internal.decode_all(packed)] == _alone(batch)


@settings(max_examples=40, deadline=None)
@given(st.lists(accesses, min_size=1, max_size=8))
def test_the_checked_read_of_a_packed_message_gives_what_the_fast_one_gives(batch: list[Access]) -> None:
    """A packed message of other fields or other text is read the checked way: on this version's message, equal."""
    packed = internal.encode_accesses(batch)
    checked = internal._checked(packed, None)
    assert [_canon(a) for a in checked] == [_canon(a) for a in internal.decode_all(packed)]
    spaced = json.dumps(json.loads(packed)).encode()  # json's text, as the fallback writes it: not the fast prefix
    assert not spaced.startswith(internal.PACKED_PREFIX)
    assert [_canon(a) for a in internal.decode_all(spaced)] == _alone(batch)


def test_an_access_holding_a_string_only_json_writes_goes_alone_and_is_refused_alone() -> None:
    """A lone surrogate (a JSON span's escapes can make one): stage 2 refuses that access, as it always did, and not
    the accesses packed beside it."""
    lone = dataclasses.replace(ACCESS, statement="SELECT '\ud800'")
    other = dataclasses.replace(ACCESS, span_id="f" * 16)
    messages = [value for _, value in internal.pack_accesses([ACCESS, lone, other, ACCESS], 1, 1 << 20)]
    assert len(messages) == 3 and messages[1] == internal.encode_access(lone)
    assert internal.decode_all(messages[0]) == [ACCESS]
    assert internal.decode_all(messages[2]) == [other, ACCESS]
    with pytest.raises(ValueError, match="lone surrogate"):
        internal.decode_all(messages[1])


def test_a_packed_message_is_grouped_by_partition_in_order_and_bounded() -> None:
    batch = [dataclasses.replace(ACCESS, entity=f"orders:{n % 40}", span_id=f"{n:016x}") for n in range(2000)]
    messages = internal.pack_accesses(batch, 3, max_bytes=64 * 1024)
    read = [(p, a) for p, value in messages for a in internal.decode_all(value)]
    assert sorted(a.span_id for _, a in read) == sorted(a.span_id for a in batch)  # every access, once
    for partition in range(3):  # each partition's accesses in the batch's order
        mine = [a for a in batch if internal.partition_of(a.entity.encode(), 3) == partition]
        assert [a for p, a in read if p == partition] == mine
    assert all(len(value) <= 64 * 1024 for _, value in messages)
    assert all(len(internal.decode_all(value)) <= internal.PACK_ROWS for _, value in messages)
    assert len(messages) < 2000 / 50  # packed: not one message per access
    huge = dataclasses.replace(ACCESS, statement="x" * 5000)
    alone = internal.pack_accesses([ACCESS, huge, ACCESS], 1, max_bytes=4096)  # halved until each fits, or alone
    assert [internal.decode_all(v) for _, v in alone] == [[ACCESS], [huge], [ACCESS]]


def test_fields_of_another_version_are_read_by_name_and_defaults_fill_what_it_did_not_send() -> None:
    """An older stage 1 (fewer fields) or one that orders them otherwise: each row read by the names it came with."""
    names = list(reversed(ACCESS_FIELDS[:-3]))  # three trailing fields missing, the rest reversed
    row = [json.loads(internal.encode_access(ACCESS))["access"][n] for n in names]
    data = json.dumps({"v": 1, "kind": "accesses", "fields": names, "rows": [row, row]}).encode()
    assert internal.decode_all(data) == [ACCESS, ACCESS]


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"fields": ["entity", "colour"], "rows": []}, "unknown field(s) ['colour']"),
        ({"fields": list(ACCESS_FIELDS), "rows": [[1]]}, f"row 0 is not a list of {len(ACCESS_FIELDS)} values"),
        ({"fields": ["entity", "table"], "rows": [["a:1", 7]]}, "access (row 0): "),  # and the access lacks fields
        ({"fields": "entity", "rows": []}, "fields must be a list of names"),
        ({"fields": [], "rows": {}}, "fields must be a list of names, rows a list"),
    ],
)
def test_a_packed_message_with_a_bad_row_is_refused_whole_naming_it(body: dict[str, Any], error: str) -> None:
    data = json.dumps({"v": 1, "kind": "accesses", **body}).encode()
    with pytest.raises(ValueError) as refused:
        internal.decode_all(data)
    assert error in str(refused.value)


def test_a_packed_row_of_the_wrong_type_on_the_fast_path_is_refused_by_the_checked_one() -> None:
    good = json.loads(internal.encode_accesses([ACCESS, ACCESS]))
    good["rows"][1][ACCESS_FIELDS.index("start_ns")] = "soon"
    data = internal.PACKED_PREFIX + json.dumps(good["rows"], separators=(",", ":")).encode() + b"}"
    with pytest.raises(ValueError, match=r"access \(row 1\)"):
        internal.decode_all(data)


def test_decode_reads_one_event_and_refuses_a_packed_message() -> None:
    with pytest.raises(ValueError, match="decode_all"):
        internal.decode(internal.encode_accesses([ACCESS, ACCESS]))
    assert internal.decode_all(internal.encode_access(ACCESS)) == (ACCESS,)


def test_a_shared_table_holds_a_packed_access_strings() -> None:
    shared = SharedStrings(10**6)
    one, two = internal.decode_all(internal.encode_accesses([ACCESS, ACCESS]), shared)
    assert isinstance(one, Access) and isinstance(two, Access)
    assert one.statement is two.statement is shared.table[ACCESS.statement]
    assert one.span_id not in shared.table


@cache
def _stage1_outputs() -> tuple[tuple[bytes, ...], tuple[bytes, ...]]:
    """Stage 1's internal messages for 4,000 bench spans, packed (the topic's partitions known) and each alone."""
    from bench import run as bench
    from bench.otlp_gen import generate_run
    from streamer import config

    start = 1_796_000_000_000_000_000
    env = bench.settings_env("127.0.0.1:9", "redis://127.0.0.1:9", "t", "bench-spans-t", 0, [])
    s = config.load(None, env=env)
    out: list[tuple[bytes, ...]] = []
    for partitions in (3, 0):
        gen = generate_run(4000, 300, 1, start_ns=start, partitions=2, shape="bench")
        clock = bench._Clock()
        clock.now = start + 10_000_000_000
        metrics, tracker = bench.Metrics(), bench.PinTracker()
        processors = bench.stage_processors(s, metrics, clock, "ingest", tracker, bench.default().factories)
        stage = bench.IngestStage(s, metrics, clock, tracker=tracker, processors=processors)
        stage.broadcast_partitions = partitions
        outs = [stage.process(polled) for polled in bench._polls(bench._records(gen, s.kafka.spans_topic), s)]
        clock.now += 3600 * 1_000_000_000
        outs += bench.close_all(stage)
        out.append(tuple(m.value for o in outs for m in o.produce if m.topic == s.kafka.accesses_topic and m.value))
    return out[0], out[1]


def test_stage1_packs_the_accesses_it_sent_alone_and_stage_2_reads_the_same_accesses() -> None:
    packed, alone = _stage1_outputs()
    read_packed = [a for m in packed for a in internal.decode_all(m) if isinstance(a, Access)]
    read_alone = [a for m in alone for a in internal.decode_all(m) if isinstance(a, Access)]
    assert len(read_alone) > 300
    assert sorted(map(_canon, read_packed)) == sorted(map(_canon, read_alone))
    accesses_messages = [m for m in packed if m.startswith(internal.PACKED_PREFIX)]
    assert len(accesses_messages) * 10 < len(read_packed)  # packed, not one message per access
