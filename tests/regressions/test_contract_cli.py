"""``trace-repro contract add``: arguments to a published contract, and mounting on the main parser."""

from __future__ import annotations

import argparse
import json

import pytest

from processors.model.contract import ProofContract
from streamer import contract_cli, gate

Sent = list[tuple[str, str, bytes, bytes]]


def publisher(sent: Sent) -> contract_cli.Publish:
    async def publish(bootstrap: str, topic: str, key: bytes, value: bytes) -> None:
        sent.append((bootstrap, topic, key, value))

    return publish


BASE = ["add", "--fingerprint", "fp1", "--signature", "error:*:RoundingError", "--must-start", "split.rounded",
        "--bootstrap", "kafka:9092"]  # fmt: skip


def test_add_publishes_the_contract_keyed_by_fingerprint() -> None:
    """The contract goes to trace-repro.contracts, keyed by the incident fingerprint, as versioned JSON."""
    sent: Sent = []
    assert contract_cli.main([*BASE, "--watch-s", "600", "--min-requests", "120", "--issue", "42"],
                             publisher(sent)) == 0  # fmt: skip
    [(bootstrap, topic, key, value)] = sent
    assert (bootstrap, topic, key) == ("kafka:9092", "trace-repro.contracts", b"fp1")
    c = ProofContract.model_validate_json(value)
    assert (c.signature, c.must_start, c.watch_s, c.min_requests, c.issue) == (
        "error:*:RoundingError", "split.rounded", 600, 120, 42)  # fmt: skip


def test_the_floor_defaults_to_the_zero_error_rule() -> None:
    """--baseline-rate 0.05 gives 59 requests; with no rate at all the 1% default gives 299."""
    sent: Sent = []
    contract_cli.main([*BASE, "--baseline-rate", "0.05"], publisher(sent))
    contract_cli.main(BASE, publisher(sent))
    assert [json.loads(v)["min_requests"] for *_, v in sent] == [59, 299]


def test_bad_arguments_exit_2_and_dry_run_publishes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """An unparseable signature is refused; --dry-run prints the contract instead of publishing it."""
    sent: Sent = []
    bad = [a if a != "error:*:RoundingError" else "nonsense" for a in BASE]
    assert contract_cli.main(bad, publisher(sent)) == 2
    assert "signature" in capsys.readouterr().err
    assert contract_cli.main([*BASE, "--dry-run"], publisher(sent)) == 0
    assert sent == [] and json.loads(capsys.readouterr().out)["fingerprint"] == "fp1"


def test_both_commands_mount_on_the_main_parser() -> None:
    """add_parser registers 'contract' and 'gate' on trace-repro's sub-parsers; args carry their handler."""
    p = argparse.ArgumentParser(prog="trace-repro")
    sub = p.add_subparsers(dest="command", required=True)
    contract_cli.add_parser(sub)
    gate.add_parser(sub)
    args = p.parse_args(["contract", *BASE])
    assert args.command == "contract" and args.handler is contract_cli.run and args.fingerprint == "fp1"
    sent: Sent = []
    assert contract_cli.run(args, publisher(sent), clock=lambda: 1.5) == 0
    assert json.loads(sent[0][3])["created_unix_ms"] == 1500.0
    g = p.parse_args(["gate", "--diff", "d", "--description", "m", "--contract", "c.json"])
    assert g.handler is gate.run
