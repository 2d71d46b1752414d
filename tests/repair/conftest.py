"""Fixtures for the repair planner: a private copy of the sample shop, and incidents as the daemon reports them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from processors.model.outputs import AccessInfo, IncidentEvent
from tests.repair.cases import (
    CAPTURE,
    CHARGE,
    CHECKOUT,
    EXPIRE,
    FIND_CHARGE,
    INSERT_CHARGE,
    NEW_ORDER,
    READ_ORDER,
    READ_ORDER_LOCKED,
    READ_STOCK,
    REPO,
    SET_STATUS,
    TAKE_UNIT,
    Access,
    incident,
)


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    """A root holding a private copy of ``bench/shop`` (as ``bench/shop``), never the real one."""
    root = tmp_path / "app"
    (root / "bench").mkdir(parents=True)
    shutil.copy(REPO / "bench" / "__init__.py", root / "bench" / "__init__.py")
    shutil.copytree(REPO / "bench" / "shop", root / "bench" / "shop", ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.fixture
def access(shop: Path) -> Access:
    """``access(function, statement, operation, trace, lock="none", at=0)``: one recorded statement of the shop."""

    def make(function: str, statement: str, operation: str, trace: str, lock: str = "none", at: float = 0.0,
             file: str | None = None) -> AccessInfo:  # fmt: skip
        module = function.split(".")[1]
        return AccessInfo(
            trace_id=trace * 32,
            span_id=f"{trace}{int(at):015d}",
            service="shop",
            version="1.0.0",
            function=function,
            file=file or str(shop / "bench" / "shop" / f"{module}.py"),
            route="",
            operation=operation,
            lock=lock,
            statement=statement,
            params=[],
            set_values={},
            start_unix_ms=1_800_000_000_000 + at,
            offset_ms=at,
            error=False,
            exception="",
            http_status=200,
        )

    return make


@pytest.fixture
def lost_update(access: Access) -> IncidentEvent:
    """capture_payment vs the expire_cart job on one order: both read 'pending' unlocked, both write."""
    accesses = [
        access(EXPIRE, READ_ORDER, "read", "a", at=-3),
        access(CAPTURE, READ_ORDER, "read", "b", at=-2),
        access(EXPIRE, SET_STATUS, "write", "a", at=0),
        access(CAPTURE, SET_STATUS, "write", "b", at=4),
    ]
    return incident("lost_update", "orders", "orders:1000", accesses[2], accesses[3], accesses)


@pytest.fixture
def oversell(access: Access) -> IncidentEvent:
    """Two checkouts of the last unit: both read stock 1, both decrement."""
    accesses = [
        access(CHECKOUT, READ_STOCK, "read", "c", at=-2),
        access(CHECKOUT, READ_STOCK, "read", "d", at=-1),
        access(CHECKOUT, TAKE_UNIT, "write", "c", at=0),
        access(CHECKOUT, TAKE_UNIT, "write", "d", at=3),
    ]
    return incident("invariant_violation", "inventory", "inventory:sku-1", accesses[2], accesses[3], accesses)


@pytest.fixture
def double_charge(access: Access) -> IncidentEvent:
    """A client retry racing the original charge request: two charge rows for one order."""
    accesses = [access(CHARGE, INSERT_CHARGE, "insert", "e", at=0), access(CHARGE, INSERT_CHARGE, "insert", "f", at=2)]
    return incident("duplicate_apply", "charges", "charges:order_id=1009", accesses[0], accesses[1], accesses)


@pytest.fixture
def order_sites(access: Access) -> list[AccessInfo]:
    """What the graph knows about ``orders``: both read-modify-write paths, their clean variants, checkout's INSERT."""
    return [
        access(CAPTURE, READ_ORDER, "read", "g"),
        access(CAPTURE, READ_ORDER_LOCKED, "read", "h", lock="for_update"),
        access(CAPTURE, SET_STATUS, "write", "g"),
        access(EXPIRE, READ_ORDER, "read", "i"),
        access(EXPIRE, SET_STATUS, "write", "i"),
        access(CHECKOUT, NEW_ORDER, "insert", "j"),
    ]


@pytest.fixture
def charge_sites(access: Access) -> list[AccessInfo]:
    """What the graph knows about ``charges``: the pre-check and INSERT of charge, and of capture_payment."""
    return [
        access(CHARGE, FIND_CHARGE, "read", "k"),
        access(CHARGE, INSERT_CHARGE, "insert", "k"),
        access(CAPTURE, INSERT_CHARGE, "insert", "l"),
    ]
