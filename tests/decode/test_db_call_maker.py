"""The decoder's ``DbCall`` maker (``processors.model.fast``) makes the ``DbCall`` its constructor makes: equal, hashed,
printed, pickled and frozen alike."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from processors.model.events import DbCall
from streamer.decode._attrs import _new_db_call as new_db_call


def test_a_db_call_made_fast_is_the_one_its_constructor_makes() -> None:
    values = ("postgresql", "SELECT $1", "shop", "orders", "SELECT", (1, "a", None), (("k", 2.5),), "tx-9", "v3")
    fast, slow = new_db_call(*values), DbCall(*values)
    assert type(fast) is DbCall and fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert dataclasses.astuple(fast) == values and pickle.loads(pickle.dumps(fast)) == slow
    assert fast != dataclasses.replace(slow, row_version="v4")
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.system = "mysql"  # type: ignore[misc]
    assert len(dataclasses.fields(DbCall)) == len(values)  # a field added to DbCall fails here
