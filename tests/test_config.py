"""Configuration: TOML + environment, precedence, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from processors.redaction import RedactionConfig
from streamer import config

REPO = Path(__file__).resolve().parents[1]


def test_example_config_loads() -> None:
    """The shipped example config is valid as it is."""
    settings = config.load(REPO / "config" / "trace-repro.toml", env={})
    assert settings.kafka.spans_topic == "otlp_spans"
    assert settings.graph_policy.detail == "paths"
    assert settings.redaction == RedactionConfig()  # the shipped [redaction] is the documented default


def test_environment_wins_over_file(tmp_path: Path) -> None:
    """TRACE_REPRO_* variables, nested with __ and the short engine aliases, override the file."""
    path = tmp_path / "c.toml"
    path.write_text('[kafka]\nbootstrap = "file:1"\ngroup_id = "from-file"\n')
    env = {"TRACE_REPRO_KAFKA_BOOTSTRAP": "env:2", "TRACE_REPRO_WINDOWS__TRACE_GAP_S": "3.5"}
    settings = config.load(path, env=env)
    assert settings.kafka.bootstrap == "env:2"
    assert settings.kafka.group_id == "from-file"
    assert settings.windows.trace_gap_s == 3.5


@pytest.mark.parametrize(
    ("env", "wait_ms"),
    [
        ({}, 1000),  # the shipped windows (idle 5 s): a fifth of it, at the upper bound
        ({"TRACE_REPRO_WINDOWS__IDLE_S": "2"}, 400),
        ({"TRACE_REPRO_WINDOWS__IDLE_S": "0.5"}, 200),  # tuned windows: the lower bound (the old fixed wait)
        ({"TRACE_REPRO_WINDOWS__IDLE_S": "60"}, 1000),
        ({"TRACE_REPRO_WINDOWS__IDLE_S": "0.5", "TRACE_REPRO_KAFKA__POLL_TIMEOUT_MS": "50"}, 50),  # set: as set
        ({"TRACE_REPRO_KAFKA__POLL_TIMEOUT_MS": "5000"}, 5000),
    ],
)
def test_the_poll_wait_follows_idleness_unless_set(env: dict[str, str], wait_ms: int) -> None:
    """An idle stage polls every fifth of ``windows.idle_s`` (200-1000 ms), or as ``kafka.poll_timeout_ms`` says."""
    assert config.load(REPO / "config" / "trace-repro.toml", env=env).poll_timeout_ms == wait_ms


def test_bad_config_names_the_key(tmp_path: Path) -> None:
    """An unknown key and an out-of-range value are both reported with their dotted names."""
    path = tmp_path / "c.toml"
    path.write_text("[kafka]\nbootstrapp = 1\n[windows]\nwindow_s = -1\n")
    with pytest.raises(config.ConfigError) as err:
        config.load(path, env={})
    assert "kafka.bootstrapp" in str(err.value)
    assert "windows.window_s" in str(err.value)


def test_secret_is_not_rendered() -> None:
    """The GitLab token is a secret: it never appears in the settings' repr."""
    settings = config.load(None, env={"TRACE_REPRO_GITLAB_TOKEN": "glpat-very-secret"})
    assert settings.gitlab_token is not None
    assert settings.gitlab_token.get_secret_value() == "glpat-very-secret"
    assert "glpat-very-secret" not in repr(settings)
