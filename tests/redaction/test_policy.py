"""The redaction policy on whole incidents: sensitive names by default, drop / hash / keep, parameters by column."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from processors.api.telemetry import Telemetry
from processors.model.outputs import IncidentEvent
from processors.redaction import DROPPED, HASHED, Policy, RedactionConfig, RedactionKeyMissing, Redactor
from processors.redaction.literals import redact_literals
from processors.redaction.policy import words
from streamer.config import ConfigError, load

FIXTURE = Path(__file__).parent.parent / "gitlab" / "fixtures" / "incident_lost_update.json"
EMAIL = "ann.lee@example.com"
CARD = "4111111111111111"
STATEMENT = "UPDATE orders SET status = %s, email = %s, version = version + 1 WHERE id = %s AND card_number = %s"


def incident() -> IncidentEvent:
    """The GitLab fixture's lost update, on a table with an ``email`` and a ``card_number`` column."""
    e = IncidentEvent.model_validate_json(FIXTURE.read_text())
    commits = [
        c.model_copy(update={"before": {**(c.before or {}), "email": EMAIL, "card_number": CARD},
                             "after": {**(c.after or {}), "email": EMAIL, "card_number": CARD}})
        for c in e.commits
    ]  # fmt: skip
    culprit = e.culprit.model_copy(update={"statement": STATEMENT, "params": ["cancelled", EMAIL, 4711, CARD],
                                           "set_values": {**e.culprit.set_values, "email": EMAIL}})  # fmt: skip
    evidence = [*e.evidence, f"lsn 1 tx 2: {{card_number={CARD!r}, email={EMAIL!r}}} -> ∅ by trace 3c907cae"]
    damage = f"value lost: email = {EMAIL!r} overwritten"
    changes = {"commits": commits, "culprit": culprit, "writers": [culprit, *e.writers[1:]], "evidence": evidence}
    return e.model_copy(update={**changes, "damage": damage})


def redactor(key: bytes | None = None, telemetry: Telemetry | None = None, **config: Any) -> Redactor:
    return Redactor(Policy(RedactionConfig(**config), key, telemetry))


def test_sensitive_names_are_matched_by_whole_words() -> None:
    """card_number, userEmail, date_of_birth, api_key look sensitive; company, span, id, status do not."""
    p = Policy(RedactionConfig())
    assert words("userEmailAddress") == ("user", "email", "address")
    for name in ("password", "card_number", "cardNumber", "userEmail", "date_of_birth", "api_key", "CVV", "iban"):
        assert p.sensitive(name), name
    for name in ("company", "span", "id", "status", "amount", "keyed", "api", "expand"):
        assert not p.sensitive(name), name


def test_by_default_sensitive_values_are_dropped_everywhere_in_the_incident() -> None:
    """Without a key: email and card_number go from the row images, set values, parameters and every text."""
    t = Telemetry("redaction")
    out = redactor(telemetry=t)(incident())
    dumped = out.model_dump_json()
    assert EMAIL not in dumped and CARD not in dumped
    assert all(c.before and c.before["email"] == DROPPED and c.before["card_number"] == DROPPED for c in out.commits)
    assert out.culprit.params == ["cancelled", DROPPED, 4711, DROPPED]
    assert out.culprit.set_values["email"] == DROPPED and out.culprit.set_values["status"] == "cancelled"
    assert out.commits[0].before and out.commits[0].before["status"] == "pending"  # other columns kept
    assert f"email={DROPPED!r}" in out.evidence[-1] and DROPPED in out.damage
    assert out.entity == "orders:4711" and out.culprit.statement == STATEMENT  # keys and parameterised SQL kept
    assert t.events["redacted_drop"] > 0 and t.events["redacted_hash"] == 0


def test_hash_is_keyed_stable_and_equal_for_equal_values() -> None:
    """With a key, sensitive values become the same token wherever they are, in every run; another key differs."""
    first, again = redactor(b"k1")(incident()), redactor(b"k1")(incident())
    token = first.commits[0].before["email"] if first.commits[0].before else ""
    assert token.startswith(HASHED) and token.endswith("]")
    assert first.culprit.params[1] == token == first.culprit.set_values["email"] == first.commits[1].after["email"]  # type: ignore[index]
    assert again == first
    assert EMAIL not in first.model_dump_json() and token in first.damage
    other = redactor(b"k2")(incident())
    assert other.culprit.params[1] != token


def test_column_rules_win_over_names_and_redaction_can_be_off() -> None:
    """A ``keep`` rule keeps a sensitive-looking column; a ``drop`` rule drops an ordinary one; off keeps all."""
    out = redactor(columns={"orders.email": "keep", "status": "drop"})(incident())
    assert out.culprit.params == [DROPPED, EMAIL, 4711, DROPPED]
    assert out.commits[0].after and out.commits[0].after["status"] == DROPPED
    assert redactor(enabled=False)(incident()) == incident()


def test_parameters_without_a_column_follow_unknown_parameters_unless_redacted_elsewhere() -> None:
    """``lower(note) = lower(%s)`` binds no column: kept by default, dropped by rule; a value seen redacted goes too."""
    e = incident()
    reader = e.victim.model_copy(update={"statement": "SELECT id FROM orders WHERE lower(note) = lower(%s) OR x = %s",
                                         "params": ["gift wrap", EMAIL]})  # fmt: skip
    e = e.model_copy(update={"victim": reader})
    kept = redactor()(e)
    assert kept.victim.params == ["gift wrap", DROPPED]  # the email is the row's, redacted in its images
    assert redactor(unknown_parameters="drop")(e).victim.params == [DROPPED, DROPPED]


def test_keys_are_kept_unless_hashed() -> None:
    """Entity keys are identifiers: kept by default; ``keys = "hash"`` hashes them in fields and in the summary."""
    out = redactor(b"k", keys="hash")(incident())
    assert out.entity.startswith("orders:" + HASHED) and "orders:4711" not in out.summary
    assert out.entity in out.summary and out.culprit.entity in ("", out.entity)


def test_redaction_is_idempotent_and_other_events_pass() -> None:
    """An event redacted twice is unchanged the second time (markers are never redacted again)."""
    r = redactor(b"k")
    once = r(incident())
    assert r(once) == once


def test_hash_without_a_key_is_refused_at_start() -> None:
    """A hash rule without TRACE_REPRO_REDACTION_KEY fails the config load, naming the setting; with it, it loads."""
    with pytest.raises(RedactionKeyMissing, match="TRACE_REPRO_REDACTION_KEY"):
        Policy(RedactionConfig(columns={"notes": "hash"}))
    env = {"TRACE_REPRO_REDACTION__COLUMNS": '{"notes": "hash"}'}
    with pytest.raises(ConfigError, match="TRACE_REPRO_REDACTION_KEY"):
        load(None, env)
    settings = load(None, {**env, "TRACE_REPRO_REDACTION_KEY": "s3cret"})
    assert settings.redaction_key == SecretStr("s3cret")
    assert Redactor.of(settings.redaction, settings.redaction_key).policy.action("t", "notes") == "hash"


def test_literals_in_statements_are_redacted_but_not_the_sql_around_them() -> None:
    """Inline literals of redacted values go; the value ``orders`` is also the table's name, which stays."""
    e = incident()
    inline = f"UPDATE orders SET email = '{EMAIL}', note = 'orders' WHERE id = 4711"
    culprit = e.culprit.model_copy(
        update={"statement": inline, "params": [], "set_values": {"email": EMAIL, "note": "orders"}}
    )
    out = redactor(columns={"note": "drop"})(e.model_copy(update={"culprit": culprit}))
    assert out.culprit.statement == f"UPDATE orders SET email = '{DROPPED}', note = '{DROPPED}' WHERE id = 4711"


def test_inline_literals_are_redacted_by_the_column_they_meet() -> None:
    """Literals compared with, set into or inserted into a sensitive column go (lower(email) too); others stay."""
    p = Policy(RedactionConfig())
    cases = {
        "UPDATE users SET email = 'a@b.c', name = 'Ann' WHERE id = 5":
            f"UPDATE users SET email = '{DROPPED}', name = 'Ann' WHERE id = 5",
        "INSERT INTO payments (id, card_number, cvv) VALUES (%s, '4111111111111111', 123)":
            f"INSERT INTO payments (id, card_number, cvv) VALUES (%s, '{DROPPED}', '{DROPPED}')",
        "SELECT id FROM users WHERE lower(email) IN ('a@b.c', 'd@e.f') AND id = $1":
            f"SELECT id FROM users WHERE lower(email) IN ('{DROPPED}', '{DROPPED}') AND id = $1",
        "SELECT id FROM users WHERE status = 'open' LIMIT 10": "SELECT id FROM users WHERE status = 'open' LIMIT 10",
        "not sql at all 'a@b.c'": "not sql at all 'a@b.c'",
    }  # fmt: skip
    for statement, expected in cases.items():
        assert redact_literals(statement, p) == expected, statement
