"""``Extractor.db_call`` reads a short ``db.statement.parameters`` string as its own text (no ``text`` call): the
parameters, the other fields and the truncations counted are those of the reference, which parses ``text(raw)``
whatever the value; and a DB span's own detail is a ``SpanDetail`` like any other."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from processors.model.span import SpanDetail
from streamer.decode._attrs import DB_PARAMS, DB_SYSTEM, DB_TEXT, SPAN_SLOTS, DecodeOptions, DecodeStats, Extractor
from streamer.decode.literals import literal_params
from streamer.decode.otlp import decode_traces_proto
from tests.decode.test_otlp_known_spans import _kv, _one_span

LIMIT = 64  # a quarter of 16 characters: strings either side of it, and past the limit


def _reference(ext: Extractor, raw: Any) -> tuple[tuple[Any, ...], tuple[tuple[str, Any], ...]]:
    if isinstance(raw, list):
        return tuple(map(ext.scalar, raw)), ()
    return literal_params(ext.text(raw))


_atoms = st.one_of(
    st.integers(-(10**30), 10**30).map(str), st.text(max_size=30).map(repr), st.sampled_from(["None", "True"])
)
_params = st.one_of(
    st.lists(_atoms, max_size=12).map(lambda xs: f"({', '.join(xs)},)" if len(xs) == 1 else f"({', '.join(xs)})"),
    st.text(max_size=90),  # not a tuple: kept as one value, or cut
    st.integers(),
    st.lists(st.one_of(st.integers(), st.text(max_size=20)), max_size=5),
)


@settings(max_examples=300, deadline=None)
@given(raw=_params)
def test_the_parameters_read_as_the_reference_reads_them(raw: Any) -> None:
    for stats in (DecodeStats(), None):
        ext = Extractor(DecodeOptions(max_attribute_bytes=LIMIT), stats)
        vals: list[Any] = [None] * SPAN_SLOTS
        vals[DB_SYSTEM], vals[DB_TEXT], vals[DB_PARAMS] = "postgresql", "SELECT %s", raw
        call = ext.db_call(vals, ())
        cut = 0 if stats is None else stats.truncated_attributes
        ref_stats = None if stats is None else DecodeStats()
        params, named = _reference(Extractor(DecodeOptions(max_attribute_bytes=LIMIT), ref_stats), raw)
        assert (call.params, call.named_params) == (params, named)
        assert cut == (0 if ref_stats is None else ref_stats.truncated_attributes)


def test_a_db_span_of_its_own_parameters_is_given_a_span_detail() -> None:
    attributes = [_kv(k, v) for k, v in (("db.system.name", "postgresql"), ("db.query.text", "SELECT %s"),
                                         ("db.statement.parameters", "(7, 'x')"))]  # fmt: skip
    [span] = decode_traces_proto(_one_span([bytes(kv.SerializeToString()) for kv in attributes], 61))
    assert type(span.detail) is SpanDetail and span.detail == SpanDetail(*span.detail)
    assert span.db is not None and span.db.params == (7, "x") and span.detail.db is span.db
