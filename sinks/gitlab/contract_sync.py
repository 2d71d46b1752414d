"""Reading the proof contracts back from the issues: a person's edit becomes the contract the desk and the gate use.

Steps in the sense of :mod:`sinks.gitlab.issues` (synchronous, idempotent, run by the sink's retrier):

- :meth:`IssueContracts.sync` reads one issue's contract section (:mod:`sinks.gitlab.contract_section`). A valid
  section that differs from the hidden last good contract is a person's edit: the hidden line is updated to it and
  the contract is returned, for the sink to publish on ``trace-repro.contracts`` (the proof desk lets a person's
  contract win over its automatic one). An invalid section gets one note saying what is wrong (per distinct text)
  and changes nothing: the last good contract stays in force.
- :meth:`IssueContracts.poll` does that for the newest open issues with the sink's first label (at most
  ``POLL_ISSUES`` per poll), so that an edit is picked up even when no event touches its issue; the sink calls it
  every ``contract_poll_s``.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from processors.api.telemetry import Telemetry
from processors.model.base import Published
from processors.model.contract import ProofContract
from sinks.gitlab import contract_section as cs
from sinks.gitlab.escape import code
from sinks.gitlab.issues import IssueRef, Issues
from sinks.gitlab.markdown import marker
from sinks.gitlab.retry import GitLabPermanentError, GitLabRetryableError

log = structlog.get_logger("trace_repro.gitlab")

POLL_ISSUES = 100


def invalid_note(description: str, error: cs.ContractSectionError) -> str:
    """The note that says the contract section is not a contract, and what stays in force."""
    return (
        f"{marker(cs.invalid_note_id(description))}\n"
        f"**The proof contract section is not valid:** {code(str(error))}.\n\n"
        "The last valid contract stays in force until the block is fixed "
        f"(keys `must_stop`, `must_start`, `watch_s`, one `key: value` per line, in the ```{cs.INFO} block).\n"
    )


class IssueContracts:
    """The contracts of the issues of one project; see the module docstring."""

    def __init__(self, issues: Issues) -> None:
        self.issues = issues

    def sync(self, ref: IssueRef) -> ProofContract | None:
        """A person's new contract in issue ``ref``, or None (no section, unchanged, or invalid: noted)."""
        issue = self.issues.project.issues.get(ref.iid)
        return self._read(issue)

    def poll(self) -> list[ProofContract]:
        """A person's new contracts in the newest open issues (see the module docstring)."""
        if not self.issues.labels:
            return []
        found = self.issues.project.issues.list(labels=self.issues.labels[0], state="opened", per_page=POLL_ISSUES,
                                                page=1, get_all=False)  # fmt: skip
        contracts = []
        for issue in found:
            contract = self._read(issue)
            if contract is not None:
                contracts.append(contract)
        return contracts

    def _read(self, issue: Any) -> ProofContract | None:
        text = str(issue.description or "")
        last_good = cs.hidden(text)
        if last_good is None:
            return None  # filed by an older release, or the hidden line was removed: nothing to compare with
        ref = IssueRef(int(issue.iid), str(issue.web_url))
        try:
            section = cs.parse(text)
        except cs.ContractSectionError as exc:
            if self.issues.note_once(ref, cs.invalid_note_id(text), invalid_note(text, exc)):
                self.issues.telemetry.count("contracts_invalid")
                log.info("gitlab.contract_invalid", iid=ref.iid, error=str(exc)[:200])
            return None
        if section is None or section == cs.Section.of(last_good):
            return None
        contract = cs.edited(last_good, section).model_copy(update={"issue": ref.iid})
        self.issues.project.issues.update(ref.iid, {"description": cs.with_hidden(text, contract)})
        self.issues.telemetry.count("contracts_edited")
        log.info("gitlab.contract_edited", iid=ref.iid, must_start=contract.must_start, signature=contract.signature)
        return contract


Run = Callable[[Callable[[], Any], str], Awaitable[Any]]  # the sink's retrier: run(step, op)


class ContractPublisher:
    """Publishes what :class:`IssueContracts` finds (``publish``: the runtime's; None: nothing is read back), and
    knows when the next poll is due (every ``poll_s``; 0 = never)."""

    def __init__(self, contracts: IssueContracts, publish: Callable[[Published], Awaitable[None]] | None, *,
                 poll_s: float, clock: Callable[[], float], telemetry: Telemetry) -> None:  # fmt: skip
        self.contracts, self.publish, self.poll_s, self.clock = contracts, publish, poll_s, clock
        self.telemetry = telemetry
        self.next_poll = clock() + poll_s  # the first poll after one period: filing comes first

    def due(self) -> bool:
        return self.publish is not None and self.poll_s > 0 and self.clock() >= self.next_poll

    async def sync(self, run: Run, ref: IssueRef) -> None:
        """Publish a person's edit of the issue ``ref``'s contract (read when an event touches the issue)."""
        if self.publish is not None:
            found: ProofContract | None = await run(functools.partial(self.contracts.sync, ref), "contract.sync")
            await self._publish([found] if found is not None else [])

    async def poll(self, run: Run, load_project: Callable[[], None]) -> None:
        """Publish the people's edits of the open issues' contracts; a failed poll waits for the next one (the
        queue's events, not the poll, decide whether the sink parks)."""
        self.next_poll = self.clock() + self.poll_s
        try:
            await run(load_project, "project")
            found: list[ProofContract] = await run(self.contracts.poll, "contract.poll")
        except (GitLabRetryableError, GitLabPermanentError) as exc:
            log.warning("gitlab.contract_poll_failed", error=type(exc).__name__)
            return
        await self._publish(found)

    async def _publish(self, contracts: list[ProofContract]) -> None:
        for contract in contracts:
            assert self.publish is not None
            await self.publish(contract)
            self.telemetry.count("contracts_published")


__all__ = ["POLL_ISSUES", "ContractPublisher", "IssueContracts", "invalid_note"]
