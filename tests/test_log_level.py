"""The log level: the ``log_level`` setting (file or ``TRACE_REPRO_LOG_LEVEL``), ``run --log-level``, and structlog
filtering by it."""

from __future__ import annotations

import os

import pytest
import structlog

from streamer import cli, config, logs


def test_the_setting_comes_from_the_environment_and_a_bad_one_names_the_key() -> None:
    """``TRACE_REPRO_LOG_LEVEL`` sets ``log_level`` (default INFO, any case); an unknown level is refused, naming the
    key."""
    assert config.load(env={}).log_level == "INFO"
    assert config.load(env={"TRACE_REPRO_LOG_LEVEL": "WARNING"}).log_level == "WARNING"
    assert config.load(env={"TRACE_REPRO_LOG_LEVEL": "debug"}).log_level == "DEBUG"
    with pytest.raises(config.ConfigError, match="log_level"):
        config.load(env={"TRACE_REPRO_LOG_LEVEL": "LOUD"})


def test_run_log_level_overrides_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """``run --log-level debug`` is upper-cased and put in the environment the daemon (and its workers) load from."""
    args = cli.parser().parse_args(["run", "--log-level", "debug"])
    assert args.log_level == "DEBUG"
    monkeypatch.setattr("streamer.daemon.run", lambda *a: 0)
    monkeypatch.delenv("TRACE_REPRO_LOG_LEVEL", raising=False)
    assert cli.main(["run", "--log-level", "error"]) == 0
    assert os.environ["TRACE_REPRO_LOG_LEVEL"] == "ERROR"
    monkeypatch.delenv("TRACE_REPRO_LOG_LEVEL")
    with pytest.raises(SystemExit):
        cli.parser().parse_args(["run", "--log-level", "chatty"])


def test_lines_below_the_level_are_not_written(capsys: pytest.CaptureFixture[str]) -> None:
    """At WARNING, info and debug lines are filtered and warnings are written; at DEBUG, debug lines are written."""
    try:
        logs.configure("WARNING")
        log = structlog.get_logger("test")
        log.info("quiet.info")
        log.debug("quiet.debug")
        log.warning("loud.warning")
        err = capsys.readouterr().err
        assert "loud.warning" in err and "quiet" not in err
        logs.configure("DEBUG")
        structlog.get_logger("test").debug("now.debug")
        assert "now.debug" in capsys.readouterr().err
    finally:
        structlog.reset_defaults()
