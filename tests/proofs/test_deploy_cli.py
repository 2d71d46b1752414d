"""``trace-repro deploy mark``: arguments to a published deploy mark, keyed by service, on the contracts topic."""

from __future__ import annotations

import json

import pytest

from processors.connectors.proofs.marks import DeployMark
from streamer import cli, deploy_cli

Sent = list[tuple[str, str, bytes, bytes]]


def publisher(sent: Sent) -> deploy_cli.Publish:
    async def publish(bootstrap: str, topic: str, key: bytes, value: bytes) -> None:
        sent.append((bootstrap, topic, key, value))

    return publish


def test_mark_publishes_on_the_contracts_topic_keyed_by_service() -> None:
    """The mark goes where the proof desk reads contracts, keyed by service, its time from --at (UTC by default)."""
    sent: Sent = []
    argv = ["mark", "--service", "checkout", "--at", "2026-12-06T03:00:00", "--name", "v42", "--bootstrap", "k:9092"]
    assert deploy_cli.main(argv, publisher(sent)) == 0
    [(bootstrap, topic, key, value)] = sent
    assert (bootstrap, topic, key) == ("k:9092", "trace-repro.contracts", b"checkout")
    mark = DeployMark.model_validate_json(value)
    assert (mark.service, mark.name, mark.at_unix_ms, mark.build) == ("checkout", "v42", 1796526000000.0, "v42")


def test_bad_arguments_exit_2_and_the_main_parser_mounts_deploy(capsys: pytest.CaptureFixture[str]) -> None:
    """An unreadable --at is refused with exit 2; ``trace-repro deploy mark --dry-run`` prints the mark (now)."""
    sent: Sent = []
    assert deploy_cli.main(["mark", "--service", "s", "--at", "yesterday", "--bootstrap", "k"], publisher(sent)) == 2
    assert "trace-repro deploy" in capsys.readouterr().err and sent == []
    assert cli.main(["deploy", "mark", "--service", "checkout", "--dry-run"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["kind"] == "deploy_mark" and printed["service"] == "checkout" and printed["at_unix_ms"] > 0
