"""The incident's issue carries its proof contract in a section people edit; the sink reads it back: an edit becomes
the contract the desk and the merge request use, a bad edit gets a note saying what is wrong and changes nothing."""

from __future__ import annotations

import asyncio

import pytest

from bench.gitlab_server import FakeGitLab
from processors.model.base import Published
from processors.model.contract import ProofContract
from sinks.gitlab import contract_section as cs
from sinks.gitlab.body_incident import description, filed_contract
from tests.gitlab.conftest import SinkFactory
from tests.gitlab.helpers import deliver, incident, occurrence, user_notes

SIGNATURE = "lost_update:orders:shop.handlers.capture_payment+shop.jobs.expire_cart"
EVENT = "trace_repro.fix.b98839ad1b70ae75"


def _block(*lines: str) -> str:
    return "\n".join([f"```{cs.INFO}", *lines, "```"])


def test_the_issue_shows_the_contract_it_is_filed_with() -> None:
    """What must stop, what must start, how long to watch: in the description, and parsed back to the same."""
    text = description(incident())
    assert cs.parse(text) == cs.Section(SIGNATURE, EVENT, 3600.0)
    assert cs.hidden(text) == filed_contract(incident())
    assert cs.contract(text, 1) == filed_contract(incident()).model_copy(update={"issue": 1})


@pytest.mark.parametrize(
    ("block", "error"),
    [(_block(f"must_stop: {SIGNATURE}", f"must_start: {EVENT}"), "missing: watch_s"),
     (_block(f"must_stop: {SIGNATURE}", f"must_start: {EVENT}", "watch_s: 6", "watch_s: 9"), "watch_s is given twice"),
     (_block(f"must_stop: {SIGNATURE}", f"must_start: {EVENT}", "watch: 60"), "line 3 ('watch: 60'): expected one of"),
     (_block("must_stop: lost_update", f"must_start: {EVENT}", "watch_s: 60"), "must_stop: signature must be"),
     (_block(f"must_stop: {SIGNATURE}", "must_start: split rounded", "watch_s: 60"), "must_start: expected an event"),
     (_block(f"must_stop: {SIGNATURE}", f"must_start: {EVENT}", "watch_s: -5"), "watch_s: expected a positive"),
     (_block(f"must_stop: {SIGNATURE}", f"must_start: {EVENT}", "watch_s: soon"), "watch_s: expected a positive"),
     (f"```{cs.INFO}\nmust_stop: {SIGNATURE}\n", "is not closed"),
     (_block(f"must_stop: {SIGNATURE}") + "\n" + _block("watch_s: 1"), "2 ```trace-repro-contract blocks")],
)  # fmt: skip
def test_a_bad_edit_is_refused_with_what_is_wrong(block: str, error: str) -> None:
    """Every key once, no other key, a signature the judge parses, an event name, a positive watch."""
    with pytest.raises(cs.ContractSectionError, match=None) as raised:
        cs.parse(f"intro\n\n{block}\n\nrest")
    assert error in str(raised.value), str(raised.value)


def test_comments_and_blank_lines_in_the_block_are_allowed() -> None:
    block = _block("# what must stop", f"must_stop: {SIGNATURE}", "", f"must_start: {EVENT}", "watch_s: 600s")
    assert cs.parse(block) == cs.Section(SIGNATURE, EVENT, 600.0)


def _edit(server: FakeGitLab, iid: int, old: str, new: str) -> None:
    """A person edits the issue's description in GitLab."""
    with server.store.lock:
        issue = next(i for i in server.store.data["issues"] if i["iid"] == iid)
        assert old in issue["description"]
        issue["description"] = issue["description"].replace(old, new)


class Recorder:
    def __init__(self) -> None:
        self.published: list[Published] = []
        self.seen = asyncio.Event()

    async def __call__(self, event: Published) -> None:
        self.published.append(event)
        self.seen.set()


async def test_a_persons_edit_becomes_the_contract(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """A person renames the must-start event and shortens the watch: the next occurrence publishes their contract
    (not automatic, the issue's number, the rest of the filed one); a replay publishes nothing more."""
    published = Recorder()
    sink = make_sink(publish=published, contract_poll_s=0)
    await deliver(sink, incident())
    assert published.published == []  # as filed: the desk's automatic contract stands
    _edit(server, 1, f"must_start: {EVENT}\nwatch_s: 3600", "must_start: orders.expire.locked\nwatch_s: 900")
    await deliver(sink, occurrence(incident(), 2))
    [contract] = published.published
    assert isinstance(contract, ProofContract)
    assert (contract.must_start, contract.watch_s, contract.issue, contract.automatic) == (
        "orders.expire.locked", 900.0, 1, False)  # fmt: skip
    assert contract.routes == filed_contract(incident()).routes and contract.signature == SIGNATURE
    assert cs.hidden(server.issues()[0]["description"]) == contract  # the last good contract, kept in the issue
    await deliver(sink, occurrence(incident(), 3))
    assert len(published.published) == 1


async def test_a_bad_edit_gets_a_note_and_the_last_good_contract_stays(
    server: FakeGitLab, make_sink: SinkFactory
) -> None:
    """A typo in the block: one note on the issue saying what is wrong (not repeated), nothing published, and the
    issue's contract is still the last good one."""
    published = Recorder()
    sink = make_sink(publish=published, contract_poll_s=0)
    await deliver(sink, incident())
    _edit(server, 1, "watch_s: 3600", "watch: 3600")
    await deliver(sink, occurrence(incident(), 2), occurrence(incident(), 3))
    notes = [n for n in user_notes(server, 1) if "proof contract section is not valid" in n]
    assert len(notes) == 1 and "expected one of must_stop, must_start, watch_s" in notes[0]
    assert published.published == []
    assert cs.contract(server.issues()[0]["description"], 1) == filed_contract(incident()).model_copy(
        update={"issue": 1})  # fmt: skip


async def test_an_edit_is_picked_up_by_the_poll_without_an_event(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """No event touches the issue: the periodic read of the open issues publishes the edit."""
    published = Recorder()
    now = [0.0]
    sink = make_sink(publish=published, contract_poll_s=60, clock=lambda: now[0])
    await deliver(sink, incident())
    _edit(server, 1, f"must_start: {EVENT}", "must_start: orders.expire.locked")
    await sink.flush()
    assert published.published == []  # not due yet
    now[0] = 61.0
    await sink.flush()
    assert [c.must_start for c in published.published if isinstance(c, ProofContract)] == ["orders.expire.locked"]


async def test_an_upgrade_of_the_description_keeps_the_persons_edit(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """A better-evidenced occurrence re-renders the description; the contract section a person edited stays."""
    sink = make_sink(contract_poll_s=0)
    weak = incident().model_copy(update={"manifest": False, "correlated": False, "confidence": 0.6, "severity": "low"})
    await deliver(sink, weak)
    _edit(server, 1, f"must_start: {EVENT}", "must_start: orders.expire.locked")
    await deliver(sink, occurrence(incident(), 2))
    text = server.issues()[0]["description"]
    assert "_None observed" not in text  # upgraded
    section = cs.parse(text)
    assert section is not None and section.must_start == "orders.expire.locked"


async def test_the_health_check_polls_when_no_event_comes(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """No event, no flush: the periodic health check starts the due poll, which publishes the edit."""
    published = Recorder()
    now = [0.0]
    sink = make_sink(publish=published, contract_poll_s=60, clock=lambda: now[0])
    await deliver(sink, incident())
    _edit(server, 1, f"must_start: {EVENT}", "must_start: orders.expire.locked")
    now[0] = 61.0
    assert await sink.healthcheck()
    await asyncio.wait_for(published.seen.wait(), 10)  # the poll runs beside the check
    assert [c.must_start for c in published.published if isinstance(c, ProofContract)] == ["orders.expire.locked"]
