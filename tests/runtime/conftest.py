"""Fixtures for runtime tests: a daemon harness per test."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.harness import Harness, harness_settings


@pytest.fixture
async def harness(kafka_bootstrap: str, falkordb_url: str) -> AsyncIterator[Harness]:
    h = Harness(harness_settings(kafka_bootstrap, falkordb_url), kafka_bootstrap, falkordb_url)
    try:
        yield h
    finally:
        await h.stop()
