"""The bench's benign traffic through stage 1 with every shipped detector: no finding (``make bench`` checks the same
on its 300k spans). With the bench's 1 s windows and with the shipped windows, so that a threshold tuned to either
cannot pass."""

from __future__ import annotations

import pytest

from bench.otlp_gen import Generated, generate_run
from bench.run import run_stage, settings_env
from streamer import config

SPANS = 60_000


@pytest.fixture(scope="module")
def traffic() -> Generated:
    return generate_run(SPANS, 30, seed=7, start_ns=1_700_000_000_000_000_000, partitions=2)


@pytest.mark.parametrize("windows", ["bench", "shipped"])
def test_no_detector_finds_anything_on_the_benign_traffic(traffic: Generated, windows: str) -> None:
    env = settings_env("127.0.0.1:9", "redis://127.0.0.1:9", "benign", "bench-spans-benign")
    if windows == "shipped":
        env = {k: v for k, v in env.items() if not k.startswith(("TRACE_REPRO_WINDOWS__", "TRACE_REPRO_PROOF__"))}
    settings = config.load(None, env=env)
    _, figures = run_stage(traffic, settings, keep=False)
    assert figures["spans"] >= SPANS
    assert figures["findings"] == {}, figures["findings"]
