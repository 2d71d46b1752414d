"""What ``trace-repro local env`` writes is read by something: sourcing it never makes ``config check`` or the
daemon report a name nothing reads."""

from __future__ import annotations

from streamer.config import settings_model
from streamer.config_names import unknown_env
from streamer.engines.local import ENVIRONMENT, KNOWN


def test_every_variable_local_env_writes_is_a_known_name() -> None:
    assert set(ENVIRONMENT) == set(KNOWN)  # one variable per engine
    assert unknown_env({name: "x" for name in ENVIRONMENT.values()}, settings_model()) == []
