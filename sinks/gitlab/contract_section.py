"""The proof contract an incident's issue carries, in a section people edit, and how the daemon reads it back.

The issue's description has a ``### Proof contract`` section holding one fenced block with the info string
``trace-repro-contract`` and three lines, ``key: value``::

    must_stop: lost_update:orders:shop.handlers.capture_payment+shop.jobs.expire_cart
    must_start: trace_repro.fix.b98839ad1b70ae75
    watch_s: 3600

``must_stop`` is the contract's signature (:func:`~processors.connectors.proofs.contracts.parse_signature`),
``must_start`` the event the fix must start emitting (a span or a log record's ``event.name``; see
:mod:`processors.repair.emit_event`), ``watch_s`` how long a new build is watched, in seconds of event time. Blank
lines and lines starting with ``#`` are ignored; every key must be there exactly once, and no other key may be.

What the daemon filed, and the last contract it accepted from the section, is kept in the hidden line
``<!-- trace-repro:contract {...} -->`` (the whole :class:`~processors.model.contract.ProofContract`, JSON with ``<``,
``>`` and ``&`` escaped). :func:`read` parses the section strictly: a valid section different from the hidden
contract is a person's edit (the sink publishes it as their contract and records it as the last good one); an
invalid one raises :class:`ContractSectionError` saying what is wrong (the sink notes it on the issue once per text
and keeps the last good contract); a description without a section (an issue filed by an older release) has none.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass

from pydantic import ValidationError

from processors.connectors.proofs.contracts import parse_signature
from processors.model.contract import EVENT_NAME, ProofContract, promised_event

INFO = "trace-repro-contract"
KEYS = ("must_stop", "must_start", "watch_s")
HEADING = "### Proof contract"
_BLOCK = re.compile(rf"^```{re.escape(INFO)}[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_HIDDEN = re.compile(r"^<!-- trace-repro:contract (\{.*\}) -->$", re.MULTILINE)
_REGION = re.compile(
    rf"^{re.escape(HEADING)}\n.*?^<!-- trace-repro:contract \{{[^\n]*\}} -->$", re.MULTILINE | re.DOTALL
)


class ContractSectionError(ValueError):
    """The issue's contract section does not make a contract; the message says what is wrong, for the issue."""


@dataclass(frozen=True, slots=True)
class Section:
    """What a person may edit: what must stop, what must start, how long to watch."""

    must_stop: str
    must_start: str
    watch_s: float

    @classmethod
    def of(cls, contract: ProofContract) -> Section:
        return cls(contract.signature, contract.must_start, contract.watch_s)


def _value(text: str) -> str:
    """A value as one line of the block: no line break, no backtick (it cannot end the fence)."""
    return " ".join(str(text).split()).replace("`", "'")


def render(contract: ProofContract) -> list[str]:
    """The section's Markdown lines, and the hidden copy of the whole contract."""
    data = contract.model_dump_json()
    hidden = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return [
        HEADING,
        "",
        "What production must show before this issue closes. Edit the block to change it: trace-repro reads it "
        "back, judges new builds by it, and commits it with its merge request (`.trace-repro/contracts/<issue>.json`).",
        "",
        f"```{INFO}",
        f"must_stop: {_value(contract.signature)}",
        f"must_start: {_value(contract.must_start)}",
        f"watch_s: {contract.watch_s:g}",
        "```",
        "",
        f"<!-- trace-repro:contract {hidden} -->",
    ]


def hidden(description: str | None) -> ProofContract | None:
    """The contract the hidden line holds (what was filed, or the last good edit), None without a valid one."""
    found = _HIDDEN.findall(description or "")
    if not found:
        return None
    try:
        return ProofContract.model_validate_json(found[-1])
    except ValidationError:
        return None


def with_hidden(description: str, contract: ProofContract) -> str:
    """``description`` with its hidden contract replaced by ``contract`` (the last good one)."""
    data = contract.model_dump_json().replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    line = f"<!-- trace-repro:contract {data} -->"
    return _HIDDEN.sub(lambda _: line, description, count=1) if _HIDDEN.search(description) else description


def keep_section(old: str, new: str) -> str:
    """``new`` (a re-rendered description) with the contract section of ``old``: a person's edit survives."""
    was = _REGION.search(old)
    if was is None or _REGION.search(new) is None:
        return new
    return _REGION.sub(lambda _: was[0], new, count=1)


def parse(description: str | None) -> Section | None:
    """The section of ``description``; None when it has no contract block; :class:`ContractSectionError` when the
    block is there but not a contract (what is wrong, in words a person can act on)."""
    blocks = _BLOCK.findall(description or "")
    if not blocks:
        if f"```{INFO}" in (description or ""):
            raise ContractSectionError(f"the ```{INFO} block is not closed by a line with ``` alone")
        return None
    if len(blocks) > 1:
        raise ContractSectionError(f"the description has {len(blocks)} ```{INFO} blocks: keep exactly one")
    values: dict[str, str] = {}
    for number, line in enumerate(blocks[0].splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        key, sep, value = text.partition(":")
        key, value = key.strip(), value.strip()
        if not sep or key not in KEYS:
            raise ContractSectionError(f"line {number} ({text[:80]!r}): expected one of {', '.join(KEYS)} as "
                                       "`key: value`")  # fmt: skip
        if key in values:
            raise ContractSectionError(f"line {number}: {key} is given twice")
        values[key] = value
    missing = [k for k in KEYS if k not in values]
    if missing:
        raise ContractSectionError(f"missing: {', '.join(missing)}")
    try:
        parse_signature(values["must_stop"])
    except ValueError as exc:
        raise ContractSectionError(f"must_stop: {exc}") from exc
    if not EVENT_NAME.match(values["must_start"]):
        raise ContractSectionError(f"must_start: expected an event name (letters, digits, _ . - : /, starting with a "
                                   f"letter or _), got {values['must_start'][:80]!r}")  # fmt: skip
    try:
        watch = float(values["watch_s"].removesuffix("s"))
    except ValueError:
        watch = -1.0
    if not 0 < watch < math.inf:
        raise ContractSectionError(f"watch_s: expected a positive number of seconds, got {values['watch_s'][:40]!r}")
    return Section(values["must_stop"], values["must_start"], watch)


def contract(description: str | None, iid: int) -> ProofContract | None:
    """The issue's contract as it stands: the hidden one with the section's fields (a valid section), or the hidden
    one alone (the last good, when the section is invalid or missing); ``issue`` set to ``iid``; None when the
    description holds neither."""
    base = hidden(description)
    try:
        section = parse(description)
    except ContractSectionError:
        section = None
    if base is None:
        return None
    if section is not None and section != Section.of(base):
        base = edited(base, section)
    return base.model_copy(update={"issue": iid})


def edited(base: ProofContract, section: Section) -> ProofContract:
    """``base`` with a person's section: their contract (not automatic), for the desk and the gate."""
    return base.model_copy(update={"signature": section.must_stop, "must_start": section.must_start,
                                   "watch_s": section.watch_s, "automatic": False})  # fmt: skip


def invalid_note_id(description: str) -> str:
    """The id of the note that says a section text is invalid: one note per distinct text."""
    blocks = _BLOCK.findall(description) or [description]
    return "contract-invalid-" + hashlib.sha256(blocks[0].encode("utf-8", "surrogatepass")).hexdigest()[:16]


__all__ = [
    "HEADING",
    "INFO",
    "ContractSectionError",
    "Section",
    "contract",
    "edited",
    "hidden",
    "invalid_note_id",
    "keep_section",
    "parse",
    "promised_event",
    "render",
    "with_hidden",
]
