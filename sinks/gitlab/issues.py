"""One issue per fingerprint: find it, file it (create-then-verify), close duplicates, count, reopen, close, note.

**Finding.** Every issue's description carries the fingerprint tag ``trace-repro::fp::<fingerprint>``
(:func:`~sinks.gitlab.markdown.fingerprint_label`). To find the issue of a fingerprint (also after a restart, when
the in-memory cache is empty) :meth:`Issues.lookup` searches the issues for the fingerprint, open or closed, and
keeps those whose description carries the tag (or, filed by an older release, whose labels do); the one with the
*lowest iid* is the issue. An issue still labelled with its tag is migrated to the bounded label scheme
(:func:`~sinks.gitlab.markdown.issue_labels`): the tag label is removed and deleted from the project.

Creation is *create-then-verify*: look up; if none, create; then list again. Two daemon instances that raced both
see every issue created for the fingerprint, both pick the lowest iid, and whoever finds an open issue that is not
the winner closes it with a note "duplicate of #N" (the tag stays, so the choice stays the same forever). Any later
lookup that still sees an open duplicate (an instance crashed before closing its own) closes it too.

**Occurrences.** Every finding files its issue alike, through its interface
(:class:`~processors.model.finding.Finding`) and the body its type or kind registered (:mod:`sinks.gitlab.body`).
A later occurrence updates the count in the description (the hidden state of :mod:`sinks.gitlab.state`) and gets a
note only for the first ``occurrence_notes`` repeats. An occurrence of a closed issue reopens it with a note (a
recurrence), unless it predates the verified fix (a late event). A FIXED verdict closes the issue and records itself
in the state, so that a replayed verdict does not close a reopened issue again.

**Steps.** Every public method here is a *step*: synchronous (python-gitlab), run in a worker thread by the
sink's retrier, and idempotent, because a POST that timed out may have been applied: creation looks the label up
again, notes carry a hidden marker and are skipped when a note with it exists (:meth:`Issues.note_once`),
description edits skip an occurrence already in the hidden state.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, replace
from typing import Any

import structlog
from gitlab.exceptions import GitlabError

from processors.api.telemetry import Telemetry
from processors.model.outputs import ReproEvent, VerdictEvent
from sinks.gitlab import bodies  # noqa: F401 - registers the bodies issue_body finds
from sinks.gitlab.body import issue_body
from sinks.gitlab.body_repro import repro_note
from sinks.gitlab.contract_section import keep_section
from sinks.gitlab.links import Links
from sinks.gitlab.markdown import (
    FP_LABEL_PREFIX,
    Filed,
    anomaly_label,
    duplicate_note,
    event_id,
    fingerprint_label,
    fingerprint_of,
    issue_labels,
    marker,
    reopen_id,
    scheme_labels,
    severity_label,
)
from sinks.gitlab.state import IssueState, occurred_at, with_state

log = structlog.get_logger("trace_repro.gitlab")

LABEL_COLOUR = "#8E44AD"
_FILENAME = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True, slots=True)
class IssueRef:
    """The issue of one fingerprint."""

    iid: int
    web_url: str


def _tagged(issue: Any, fingerprint: str) -> bool:
    """Whether ``issue`` is the fingerprint's (exactly, not one the search matched inside another): its description's
    footer tag or hidden state names it, or (older releases) its labels do."""
    tag = fingerprint_label(fingerprint)
    text = str(issue.description or "")
    if fingerprint_of(text) == tag.removeprefix(FP_LABEL_PREFIX) or tag in list(issue.labels or []):
        return True
    state = IssueState.parse(text)
    return state is not None and state.fingerprint == fingerprint


class Issues:
    """The issues of one project, by fingerprint; see the module docstring. ``project`` is set by the sink."""

    def __init__(self, *, labels: tuple[str, ...], occurrence_notes: int, telemetry: Telemetry,
                 confidential: bool = False, links: Links | None = None) -> None:  # fmt: skip
        self.project: Any = None  # python-gitlab's Project, loaded by the sink's first step
        self.labels = labels
        self.links = links or Links()
        self.confidential = confidential  # file issues only project members can see
        self.occurrence_notes = occurrence_notes
        self.telemetry = telemetry
        self.known: dict[str, IssueRef] = {}  # fingerprint -> its issue, once filed or found
        self._posted: set[tuple[int, str]] = set()  # (iid, note id) known to be posted

    def ensure_labels(self) -> None:
        """Create the configured labels and the scheme's (a fixed set) that the project lacks."""
        existing = {lb.name for lb in self.project.labels.list(get_all=True)}
        for name in dict.fromkeys([*self.labels, *scheme_labels()]):
            if name not in existing:
                try:
                    self.project.labels.create({"name": name, "color": LABEL_COLOUR,
                                                "description": "Filed by trace-repro"})  # fmt: skip
                except GitlabError as exc:
                    if exc.response_code != 409:  # created meanwhile
                        raise

    def lookup(self, fingerprint: str, *, only: int | None = None) -> IssueRef | None:
        """The lowest-iid issue tagged with the fingerprint; closes open duplicates of it (or just ``only``), and
        migrates a tag label of an older release away."""
        found = self.project.issues.list(search=fingerprint, state="all", get_all=True)
        issues = sorted((i for i in found if _tagged(i, fingerprint)), key=lambda i: int(i.iid))
        if not issues:
            return None
        winner = issues[0]
        ref = IssueRef(int(winner.iid), str(winner.web_url))
        for issue in issues:
            self._migrate(issue)
        for other in issues[1:]:
            if other.state != "closed" and only in (None, int(other.iid)):
                self.note_once(IssueRef(int(other.iid), str(other.web_url)), f"duplicate-of-{ref.iid}",
                               duplicate_note(ref.iid))  # fmt: skip
                self.project.issues.update(other.iid, {"state_event": "close"})
                self.telemetry.count("duplicates_closed")
                log.info("gitlab.duplicate_closed", fingerprint=fingerprint, iid=int(other.iid), winner=ref.iid)
        self.known[fingerprint] = ref
        return ref

    def _migrate(self, issue: Any) -> None:
        """Remove the per-defect tag labels of an older release from ``issue`` and delete them from the project."""
        old = [lb for lb in list(issue.labels or []) if lb.startswith(FP_LABEL_PREFIX)]
        if not old:
            return
        self.project.issues.update(issue.iid, {"remove_labels": ",".join(old)})
        for name in old:
            try:
                self.project.labels.delete(name)
            except GitlabError as exc:
                if exc.response_code != 404:  # deleted meanwhile
                    raise
        self.telemetry.count("labels_migrated")
        log.info("gitlab.labels_migrated", iid=int(issue.iid), removed=len(old))

    def find_or_create(self, e: Filed) -> tuple[IssueRef, bool]:
        """The fingerprint's issue, and whether this call filed it (with ``e`` already counted in it)."""
        found = self.known.get(e.fingerprint) or self.lookup(e.fingerprint)
        if found is not None:
            return found, False
        body = issue_body(e)
        labels = issue_labels(self.labels, body.anomaly(), e)
        fields: dict[str, Any] = {"title": body.title(), "description": body.description(links=self.links),
                                  "labels": labels}  # fmt: skip
        if self.confidential:
            fields["confidential"] = True
        issue = self.project.issues.create(fields)
        self.telemetry.count("issues_created")
        # Verify: a racing instance may have filed it too. Close only our own issue if it lost; the other
        # instance closes its own (a crashed one's is closed by any later lookup).
        winner = self.lookup(e.fingerprint, only=int(issue.iid))
        if winner is None:  # not listed yet: trust our own
            winner = self.known[e.fingerprint] = IssueRef(int(issue.iid), str(issue.web_url))
        return winner, winner.iid == int(issue.iid)

    def occurrence(self, ref: IssueRef, e: Filed) -> None:
        """Count a later occurrence: a bounded note, or a reopening note when the issue is closed."""
        issue = self.project.issues.get(ref.iid)
        text = str(issue.description or "")
        parsed = IssueState.parse(text)
        if parsed is not None and parsed.seen(e.occurrence):
            return  # counted before: a replay
        # A description whose state line was edited away restarts the count at the occurrence that filed it.
        state = parsed or replace(IssueState.first(e), recent=())
        number = state.occurrences + 1
        closed = issue.state == "closed"
        reopen = closed and (state.fixed_after_ms is None or occurred_at(e) >= state.fixed_after_ms)
        body = issue_body(e)
        if reopen:
            self.note_once(ref, reopen_id(e), body.reopen_note(state.fixed_after_ms))
        elif number - 1 <= self.occurrence_notes:
            note = body.occurrence_note(number, last=number - 1 == self.occurrence_notes, links=self.links)
            self.note_once(ref, event_id(e), note)
        counted = state.with_occurrence(e)
        update: dict[str, Any] = {"description": with_state(text, counted)}
        scopes = {lb.split("::", 1)[0] for lb in list(issue.labels or []) if "::" in lb}
        add = [x for x in (anomaly_label(body.anomaly()), severity_label(e)) if x and x.split("::", 1)[0] not in scopes]
        remove: list[str] = []
        if counted.better(e):
            # A better-evidenced occurrence (``Finding.rank``: for an incident manifest, its row changes correlated,
            # more confident) of the same defect: the issue shows it from now on, instead of a new issue being opened.
            upgraded = replace(counted, evidence=e.rank())
            update["description"] = keep_section(text, body.description(upgraded, self.links))
            update["title"] = body.title()
            severity = severity_label(e)
            if severity is not None:  # a latent defect that did damage: severity::low becomes severity::high
                add.append(severity)
                remove += [x for x in scheme_labels() if x.startswith("severity::") and x != severity]
            self.note_once(ref, f"upgrade-{e.occurrence}", body.upgrade_note())
            self.telemetry.count("upgraded")
        if add:  # the scheme's labels an issue lacks (filed by an older release, or relabelled by a person)
            update["add_labels"] = ",".join(dict.fromkeys(add))
        if remove:
            update["remove_labels"] = ",".join(remove)
        if reopen:
            update["state_event"] = "reopen"
        self.project.issues.update(ref.iid, update)
        self.telemetry.count("occurrences")
        if reopen:
            self.telemetry.count("reopened")
            log.info("gitlab.reopened", fingerprint=e.fingerprint, iid=ref.iid, occurrence=e.occurrence)

    def close_fixed(self, ref: IssueRef, e: VerdictEvent) -> None:
        """Close the issue for a FIXED verdict, once: a replayed verdict leaves a reopened issue open."""
        issue = self.project.issues.get(ref.iid)
        text = str(issue.description or "")
        state = IssueState.parse(text)
        verdict = event_id(e)
        if state is not None and verdict in state.verdicts:
            return  # applied before: a replayed verdict must not re-close a recurrence
        update: dict[str, Any] = {"state_event": "close"}
        if state is not None:
            update["description"] = with_state(text, state.with_fix(verdict, e.receipt.window_start_unix_ms))
        self.project.issues.update(ref.iid, update)
        self.telemetry.count("closed")
        log.info("gitlab.closed", fingerprint=e.fingerprint, iid=ref.iid, outcome=e.outcome)

    def has_note(self, ref: IssueRef, note_id: str) -> bool:
        if (ref.iid, note_id) in self._posted:
            return True
        tag = marker(note_id)
        notes = self.project.issues.get(ref.iid, lazy=True).notes.list(get_all=True)
        if any(str(n.body).startswith(tag) for n in notes):
            self._posted.add((ref.iid, note_id))
            return True
        return False

    def note_once(self, ref: IssueRef, note_id: str, text: str) -> bool:
        """Post ``text`` (which starts with the marker of ``note_id``) unless a note with that marker exists."""
        if self.has_note(ref, note_id):
            return False
        self.project.issues.get(ref.iid, lazy=True).notes.create({"body": text})
        self._posted.add((ref.iid, note_id))
        self.telemetry.count("notes")
        return True

    def upload(self, filename: str, data: str) -> str:
        """Upload a file to the project; its Markdown link."""
        safe = _FILENAME.sub("_", filename).strip("._") or "attachment.txt"
        result: dict[str, Any] = self.project.upload(safe, filedata=data.encode())
        self.telemetry.count("uploads")
        return str(result["markdown"])

    def repro_note(self, ref: IssueRef, e: ReproEvent) -> None:
        """The repro's note, with the test file and the patch uploaded (only when the note is not there yet)."""
        note_id = event_id(e)
        if self.has_note(ref, note_id):
            return
        test_link = self.upload(posixpath.basename(e.test_path) or "test_repro.py", e.test_source)
        patch_link = self.upload(f"trace-repro-{e.fingerprint}.patch", e.patch) if e.patch else None
        self.note_once(ref, note_id, repro_note(e, test_link, patch_link, self.links))


__all__ = ["LABEL_COLOUR", "IssueRef", "Issues"]
