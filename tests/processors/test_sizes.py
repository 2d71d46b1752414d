"""processors.model.sizes and the correlator's write histories: the approximate sizes the byte bounds count."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from processors.correlation.write_history import WriteHistory
from processors.model.events import Access, DbOperation, LockMode
from processors.model.sizes import ACCESS_OVERHEAD_BYTES, WHERE_BYTES_PER_CHAR, WORD, access_bytes, values_bytes


class Text(str):
    """A str subclass: sized by its length like any str."""


def _reference(values: Any) -> int:
    """``values_bytes`` as it was first written (``isinstance`` throughout)."""
    return sum(
        len(v)
        if isinstance(v, str | bytes)
        else sum(len(x) if isinstance(x, str | bytes) else WORD for x in v)
        if isinstance(v, tuple)
        else WORD
        for v in values
    )


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=5),
    st.binary(max_size=5),
    st.text(max_size=5).map(Text),
)
VALUES = st.lists(st.one_of(SCALARS, st.tuples(SCALARS, SCALARS), st.tuples(st.tuples(SCALARS))), max_size=6)


@given(VALUES)
def test_values_are_sized_by_their_kind(values: list[Any]) -> None:
    """Strings and bytes (and their subclasses) by length, tuples by their items, anything else (a bool, a float,
    a tuple inside a tuple) a word."""
    assert values_bytes(values) == _reference(values)


def _access(i: int, params: tuple[Any, ...], where: bool) -> Access:
    return Access(
        entity="orders:*",
        table="orders",
        operation=DbOperation.WRITE,
        lock=LockMode.NONE,
        trace_id=f"{i:032x}",
        span_id=f"{i:016x}",
        service="s",
        version="1",
        start_ns=i,
        end_ns=i + 1,
        statement="UPDATE orders SET status = %s WHERE total > %s",
        params=params,
        set_values=(("status", params[0] if params else None),),
        predicates=(("total", ">", params),),
        where=(("cmp", ">", ("col", "total"), ("$", 0)), (params,)) if where else None,
        candidates=("f", "g"),
    )


@given(st.lists(st.tuples(VALUES.map(tuple), st.booleans()), min_size=1, max_size=8), st.integers(1, 4))
def test_a_write_history_counts_the_size_of_what_it_holds(
    writes: list[tuple[tuple[Any, ...], bool]], maxlen: int
) -> None:
    """An access's size is its parts' (statement, values, WHERE, candidates); a history's is the sum over the
    writes it holds, however many it dropped at ``maxlen`` or by ``popleft``."""
    history = WriteHistory(maxlen)
    for i, (params, where) in enumerate(writes):
        a = _access(i, params, where)
        expected = (
            ACCESS_OVERHEAD_BYTES
            + len(a.statement)
            + _reference(params)
            + _reference([a.set_values[0][1]])
            + _reference([params])
            + (WHERE_BYTES_PER_CHAR * len(a.statement) + _reference([params]) if where else 0)
            + 2
        )
        assert access_bytes(a) == expected
        history.append(a)
        if i % 3 == 2:
            history.popleft()
        assert history.bytes == sum(access_bytes(h) for h in history)
