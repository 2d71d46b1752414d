"""``trace-repro config check``: a configuration validated as the daemon loads it, a typo named with its key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from streamer import cli, config
from streamer.config_check import problems
from streamer.config_names import unknown_env
from streamer.engines import local

REPO = Path(__file__).resolve().parents[1]


def test_typo_in_an_environment_name_names_the_closest_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A TRACE_REPRO_* name nothing reads (top level or nested) is refused with the valid name it was meant to be."""
    for name in [n for n in os.environ if n.startswith("TRACE_REPRO_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TRACE_REPRO_KAFKA__GROUPID", "g")
    monkeypatch.setenv("TRACE_REPRO_ENVIRONMNET", "prod")
    monkeypatch.setenv("TRACE_REPRO_MCP_TOKEN", "t")  # the MCP server's: known, not a typo
    assert cli.main(["config", "check"]) == 2
    err = capsys.readouterr().err
    assert "TRACE_REPRO_KAFKA__GROUPID: unknown environment name" in err
    assert "did you mean TRACE_REPRO_KAFKA__GROUP_ID?" in err
    assert "did you mean TRACE_REPRO_ENVIRONMENT?" in err
    assert "MCP_TOKEN" not in err
    assert "kafka.groupid" not in err  # the same typo is not reported twice (as pydantic's extra input)


def test_unknown_toml_key_names_the_closest_key(tmp_path: Path) -> None:
    """A key no section has, and a section nobody declares, are named with the closest valid key."""
    path = tmp_path / "c.toml"
    path.write_text('[kafka]\ncdc_patern = "x"\n[windows]\ntrace_gap = 3\n[colisions]\nwindow_s = 2\n')
    found = problems(path, {})
    assert f"{path}: unknown key kafka.cdc_patern; did you mean kafka.cdc_pattern?" in found
    assert f"{path}: unknown key windows.trace_gap; did you mean windows.trace_gap_s?" in found
    assert f"{path}: unknown key colisions; did you mean collisions?" in found
    assert len(found) == 3


def test_invalid_values_and_a_bad_pattern_are_problems(tmp_path: Path) -> None:
    """What the settings refuse is reported by key, and so is a CDC pattern that is no regular expression."""
    assert problems(None, {"TRACE_REPRO_HTTP__PORT": "99999"})[0].startswith("http.port:")
    assert problems(None, {"TRACE_REPRO_KAFKA__CDC_PATTERN": "^shop\\.(["})[0].startswith("kafka.cdc_pattern:")


def test_good_config_passes(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The shipped example config, with the local engines' variables, is good: exit status 0."""
    for name in [n for n in os.environ if n.startswith("TRACE_REPRO_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TRACE_REPRO_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    monkeypatch.setenv("TRACE_REPRO_WINDOWS__TRACE_GAP_S", "2")
    assert cli.main(["config", "check", "--config", str(REPO / "config" / "trace-repro.toml")]) == 0
    assert "config ok" in capsys.readouterr().out


def test_every_setting_has_a_valid_environment_name() -> None:
    """Every key of the settings model (component sections included) is a valid name: none is reported."""
    model = config.settings_model()
    env = {f"TRACE_REPRO_{k.upper()}": "" for k in ("collisions__window_s", "gitlab__url", "redaction__enabled")}
    assert unknown_env(env, model) == []


def test_daemon_refuses_an_unknown_name_at_start(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``trace-repro run`` with a TRACE_REPRO_* name nothing reads (a typo: its setting would keep the default) does
    not start (exit 2) and names the closest valid name; ``unknown_env = "warn"`` runs with a warning instead."""
    from streamer import daemon
    from streamer.runtime import app

    for name in [n for n in os.environ if n.startswith("TRACE_REPRO_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TRACE_REPRO_KAFKA_BOOTSTRAPP", "kafka.internal:9093")
    served: list[str] = []
    monkeypatch.setattr(app, "serve", lambda settings, stages: served.append(settings.kafka.bootstrap) or 0)
    assert daemon.run(None) == 2
    assert served == []
    err = capsys.readouterr().err
    assert "error: TRACE_REPRO_KAFKA_BOOTSTRAPP is not a setting" in err
    assert "did you mean TRACE_REPRO_KAFKA_BOOTSTRAP?" in err
    monkeypatch.setenv("TRACE_REPRO_UNKNOWN_ENV", "warn")
    assert daemon.run(None) == 0
    assert served == ["127.0.0.1:9092"]  # the typo left the setting at its default
    assert "warning: TRACE_REPRO_KAFKA_BOOTSTRAPP is not a setting" in capsys.readouterr().err


def test_the_local_engines_names_are_not_typos() -> None:
    """Every name ``trace-repro local env`` exports (and the demo passes to its daemon) is known: none is refused."""
    assert set(local.ENVIRONMENT) == set(local.KNOWN)  # one variable per engine
    assert unknown_env(dict.fromkeys(local.ENVIRONMENT.values(), ""), config.settings_model()) == []


def test_daemon_refuses_a_typo_inside_a_section_naming_the_closest_key() -> None:
    """A nested typo (a section's unknown key) already stops the daemon at start; its message names the key meant."""
    with pytest.raises(config.ConfigError) as refused:
        config.load(None, env={"TRACE_REPRO_KAFKA__AUTO_OFFSET_RESTE": "earliest"})
    assert "kafka.auto_offset_reste: Extra inputs are not permitted; did you mean kafka.auto_offset_reset?" in str(
        refused.value
    )


def test_schema_registry_names_known_and_a_typo_named(tmp_path: Path) -> None:
    """``[decode.schema_registry]`` by environment and TOML; a misspelt key gets the closest valid name; a URL that is
    not http(s) is refused by key."""
    env = {"TRACE_REPRO_DECODE__SCHEMA_REGISTRY__URL": "http://127.0.0.1:8081",
           "TRACE_REPRO_DECODE__SCHEMA_REGISTRY__PASSWORD": "s3cret"}  # fmt: skip
    assert problems(None, env) == []
    typo = unknown_env({"TRACE_REPRO_DECODE__SCHEMA_REGISTRY__URI": "x"}, config.settings_model())
    assert typo == [("TRACE_REPRO_DECODE__SCHEMA_REGISTRY__URI", "TRACE_REPRO_DECODE__SCHEMA_REGISTRY__URL")]
    path = tmp_path / "c.toml"
    path.write_text('[decode.schema_registry]\nurl = "file:///etc/passwd"\nmax_schema = 3\n')
    found = problems(path, {})
    assert any(p.startswith("decode.schema_registry.url:") for p in found)
    assert (
        f"{path}: unknown key decode.schema_registry.max_schema; did you mean decode.schema_registry.max_schemas?"
        in found
    )
