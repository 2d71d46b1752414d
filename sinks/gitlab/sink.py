"""The GitLab sink: one issue per incident fingerprint, kept up to date by later events.

**One issue per fingerprint.** Every issue carries the scoped label ``trace-repro::fp::<fingerprint>``. To find
the issue of a fingerprint (also after a restart, when the in-memory cache is empty) the sink lists the issues
with that label, open or closed; the one with the *lowest iid* is the issue. Creation is *create-then-verify*:
look up; if none, create; then list again. Two daemon instances that raced both see every issue created for the
fingerprint, both pick the lowest iid, and whoever finds an open issue that is not the winner closes it with a
note "duplicate of #N" (the label stays, so the choice stays the same forever). Any later lookup that still sees
an open duplicate (an instance crashed before closing its own) closes it too.

**Later events are notes and edits.** A repeated occurrence updates the count in the description (the hidden
state line, see :mod:`sinks.gitlab.body`) and gets a note only for the first ``occurrence_notes`` repeats. A
``ReproEvent`` adds a note with RED/GREEN, the divergence report, and the uploaded test file and patch; with
``merge_requests=True`` a proven repro also gets a branch ``trace-repro/<fingerprint>``, a commit of the test and
the repaired files, and a merge request that says "Proves #N". A ``VerdictEvent`` adds a note with its receipt; a
FIXED verdict closes the issue. A new occurrence of a closed fingerprint reopens it (a regression), unless the
occurrence predates the verified fix (a late event).

**Nothing lost, nothing twice.** ``add`` queues, ``flush`` delivers the queue in order. Each delivery is a series
of *steps*, each an idempotent unit retried as a whole by :class:`~sinks.gitlab.retry.Retrier` (429, 5xx,
timeouts, dropped connections; bounded attempts; ``Retry-After`` honoured). A POST that timed out may have been
applied, so steps look before they write: issue creation looks the label up again, notes carry a hidden marker
``<!-- trace-repro:event:<id> -->`` and are skipped when a note with it exists, description edits skip an
occurrence already in the hidden state. On exhaustion ``flush`` raises
:class:`~sinks.gitlab.retry.GitLabRetryableError` and keeps the event queued: the daemon must not commit its
offsets, and may call ``flush`` again or replay the input later. A permanent error (a 4xx) drops the event from
the queue and raises :class:`~sinks.gitlab.retry.GitLabPermanentError` carrying it (for a dead-letter topic).

**The token** is a ``SecretStr`` unwrapped only into python-gitlab's ``PRIVATE-TOKEN`` header; log lines carry
operation names and status codes only, error texts are redacted, and python-gitlab's debug mode is never enabled.
"""

from __future__ import annotations

import asyncio
import functools
import posixpath
import random
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import gitlab
import structlog
from gitlab._backends.requests_backend import RequestsBackend, RequestsResponse
from gitlab.exceptions import GitlabError
from pydantic import SecretStr

from sinks.gitlab import body, patching
from sinks.gitlab.escape import title_text
from sinks.gitlab.retry import (
    GitLabPermanentError,
    GitLabRetryableError,
    Retrier,
    RetryPolicy,
    Sleep,
    TransientHTTPError,
    parse_retry_after,
)
from streamer.schemas import IncidentEvent, ReproEvent, VerdictEvent

log = structlog.get_logger("trace_repro.gitlab")

T = TypeVar("T")
Event = IncidentEvent | ReproEvent | VerdictEvent
DEFAULT_LABELS = ("trace-repro",)
LABEL_COLOUR = "#8E44AD"
_FILENAME = re.compile(r"[^A-Za-z0-9_.-]+")


class _Transport(RequestsBackend):
    """python-gitlab's requests backend, raising 429 and 5xx (with ``Retry-After``) to our retry loop."""

    def http_request(self, method: str, url: str, *args: Any, **kwargs: Any) -> RequestsResponse:
        result: RequestsResponse = super().http_request(method, url, *args, **kwargs)
        status = result.status_code
        if status == 429 or status >= 500:
            raise TransientHTTPError(status, parse_retry_after(result.headers.get("Retry-After")), method)
        return result


@dataclass(frozen=True, slots=True)
class IssueRef:
    """The issue of one fingerprint."""

    iid: int
    web_url: str


class GitLabSink:
    """Files incidents as GitLab issues and keeps them current; see the module docstring."""

    def __init__(
        self,
        url: str,
        project: str | int,
        token: SecretStr,
        *,
        labels: tuple[str, ...] = DEFAULT_LABELS,
        timeout_s: float = 10.0,
        max_attempts: int = 5,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        max_retry_after_s: float = 120.0,
        occurrence_notes: int = 5,
        merge_requests: bool = False,
        target_branch: str | None = None,
        ssl_verify: bool = True,
        sleep: Sleep = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self._secret = token.get_secret_value()
        self._gl = gitlab.Gitlab(url, private_token=self._secret, timeout=timeout_s, ssl_verify=ssl_verify,
                                 retry_transient_errors=False, backend=_Transport)  # fmt: skip
        self._project_ref = project
        self._project: Any = None
        self.labels = tuple(dict.fromkeys(labels))
        self.occurrence_notes = occurrence_notes
        self.merge_requests = merge_requests
        self.target_branch = target_branch
        policy = RetryPolicy(max_attempts=max_attempts, base_s=backoff_s, max_backoff_s=max_backoff_s,
                             max_retry_after_s=max_retry_after_s)  # fmt: skip
        self._retrier = Retrier(policy, sleep=sleep, rng=rng, redact=self._redact)
        self._queue: deque[Event] = deque()
        self._lock = asyncio.Lock()
        self._issues: dict[str, IssueRef] = {}
        self._posted: set[tuple[int, str]] = set()
        self._labels_ready = False
        self.counters = dict.fromkeys(
            ("issues_created", "duplicates_closed", "notes", "occurrences", "reopened", "closed",
             "uploads", "merge_requests", "orphans", "rejected"), 0)  # fmt: skip

    def __repr__(self) -> str:
        return f"GitLabSink(url={self._gl.url!r}, project={self._project_ref!r}, token=SecretStr('**********'))"

    # ---- public API -------------------------------------------------------------------------------------------

    async def add(self, event: Event) -> None:
        """Queue ``event``; :meth:`flush` delivers it."""
        self._queue.append(event)

    @property
    def pending(self) -> int:
        return len(self._queue)

    async def flush(self) -> None:
        """Deliver every queued event in order; on a retryable failure the rest stays queued (see module doc)."""
        async with self._lock:
            while self._queue:
                event = self._queue[0]
                try:
                    await self._deliver(event)
                except GitLabPermanentError as exc:
                    self._queue.popleft()
                    self.counters["rejected"] += 1
                    exc.event = event
                    raise
                self._queue.popleft()

    async def healthcheck(self) -> bool:
        """One unretried request for the project: is GitLab reachable with this token?"""
        try:
            await asyncio.to_thread(self._load_project, True)
            return True
        except Exception as exc:
            log.warning("gitlab.unhealthy", error=type(exc).__name__)
            return False

    async def close(self) -> None:
        await asyncio.to_thread(self._gl.session.close)

    def issue_url(self, fingerprint: str) -> str | None:
        """The web URL of the fingerprint's issue, once this sink has filed or found it."""
        ref = self._issues.get(fingerprint)
        return ref.web_url if ref else None

    def issue_iid(self, fingerprint: str) -> int | None:
        ref = self._issues.get(fingerprint)
        return ref.iid if ref else None

    # ---- delivery ---------------------------------------------------------------------------------------------

    async def _run(self, step: Callable[[], T], op: str) -> T:
        return await self._retrier.run(step, op=op)

    async def _deliver(self, event: Event) -> None:
        if self._project is None:
            await self._run(self._load_project, "project")
        if not self._labels_ready:
            await self._run(self._ensure_labels, "labels")
            self._labels_ready = True
        if isinstance(event, IncidentEvent):
            await self._incident(event)
        elif isinstance(event, ReproEvent):
            await self._repro(event)
        else:
            await self._verdict(event)

    async def _incident(self, e: IncidentEvent) -> None:
        for attempt in (1, 2):
            ref, created = await self._run(lambda: self._find_or_create(e), "issue.create")
            if created:
                log.info("gitlab.issue", fingerprint=e.fingerprint, iid=ref.iid, url=ref.web_url)
                return
            try:
                await self._run(functools.partial(self._occurrence, ref, e), "issue.occurrence")
                return
            except GitLabPermanentError as exc:
                if exc.status != 404 or attempt == 2:
                    raise
                self._issues.pop(e.fingerprint, None)  # deleted meanwhile: look it up (or file it) again

    async def _repro(self, e: ReproEvent) -> None:
        noted = await self._on_issue(e.fingerprint, "note.repro", lambda ref: self._repro_note(ref, e))
        if noted and self.merge_requests and e.proven:
            await self._on_issue(e.fingerprint, "merge_request", lambda ref: self._merge_request(ref, e))

    async def _verdict(self, e: VerdictEvent) -> None:
        note = body.verdict_note(e)
        noted = await self._on_issue(
            e.fingerprint, "note.verdict", lambda ref: self._note_once(ref, body.event_id(e), note)
        )
        if noted and e.outcome == "FIXED":
            await self._on_issue(e.fingerprint, "issue.close", lambda ref: self._close_fixed(ref, e))

    async def _on_issue(self, fingerprint: str, op: str, step: Callable[[IssueRef], object]) -> bool:
        """Run ``step`` on the fingerprint's issue; False (and nothing done) when no issue was ever filed."""
        for attempt in (1, 2):
            ref = self._issues.get(fingerprint) or await self._run(lambda: self._lookup(fingerprint), "issue.lookup")
            if ref is None:
                self.counters["orphans"] += 1
                log.warning("gitlab.no_issue", fingerprint=fingerprint, op=op)  # its incident was never filed
                return False
            try:
                await self._run(functools.partial(step, ref), op)
                return True
            except GitLabPermanentError as exc:
                if exc.status != 404 or attempt == 2:
                    raise
                self._issues.pop(fingerprint, None)  # deleted meanwhile: look it up again
        return False

    # ---- steps (synchronous, idempotent, run in a worker thread) ----------------------------------------------

    def _load_project(self, force: bool = False) -> None:
        if self._project is None or force:
            self._project = self._gl.projects.get(self._project_ref)

    def _ensure_labels(self) -> None:
        existing = {lb.name for lb in self._project.labels.list(get_all=True)}
        for name in self.labels:
            if name not in existing:
                try:
                    self._project.labels.create({"name": name, "color": LABEL_COLOUR,
                                                 "description": "Filed by trace-repro"})  # fmt: skip
                except GitlabError as exc:
                    if exc.response_code != 409:  # created meanwhile
                        raise

    def _lookup(self, fingerprint: str, *, only: int | None = None) -> IssueRef | None:
        """The lowest-iid issue carrying the fingerprint's label; closes open duplicates of it (or just ``only``)."""
        issues = sorted(
            self._project.issues.list(labels=[body.fingerprint_label(fingerprint)], state="all", get_all=True),
            key=lambda i: int(i.iid),
        )
        if not issues:
            return None
        winner = issues[0]
        ref = IssueRef(int(winner.iid), str(winner.web_url))
        for other in issues[1:]:
            if other.state != "closed" and only in (None, int(other.iid)):
                self._note_once(IssueRef(int(other.iid), str(other.web_url)), f"duplicate-of-{ref.iid}",
                                body.duplicate_note(ref.iid))  # fmt: skip
                self._project.issues.update(other.iid, {"state_event": "close"})
                self.counters["duplicates_closed"] += 1
                log.info("gitlab.duplicate_closed", fingerprint=fingerprint, iid=int(other.iid), winner=ref.iid)
        self._issues[fingerprint] = ref
        return ref

    def _find_or_create(self, e: IncidentEvent) -> tuple[IssueRef, bool]:
        """The fingerprint's issue, and whether this call filed it (with ``e`` already counted in it)."""
        found = self._issues.get(e.fingerprint) or self._lookup(e.fingerprint)
        if found is not None:
            return found, False
        labels = [*self.labels, body.fingerprint_label(e.fingerprint)]
        issue = self._project.issues.create(
            {"title": body.title(e), "description": body.description(e), "labels": labels}
        )
        self.counters["issues_created"] += 1
        # Verify: a racing instance may have filed it too. Close only our own issue if it lost; the other
        # instance closes its own (a crashed one's is closed by any later lookup).
        winner = self._lookup(e.fingerprint, only=int(issue.iid))
        if winner is None:  # not listed yet: trust our own
            winner = self._issues[e.fingerprint] = IssueRef(int(issue.iid), str(issue.web_url))
        return winner, winner.iid == int(issue.iid)

    def _occurrence(self, ref: IssueRef, e: IncidentEvent) -> None:
        issue = self._project.issues.get(ref.iid)
        text = str(issue.description or "")
        parsed = body.IssueState.parse(text)
        if parsed is not None and parsed.seen(e.occurrence):
            return  # counted before: a replay
        # A description whose state line was edited away restarts the count at the occurrence that filed it.
        state = parsed or replace(body.IssueState.first(e), recent=())
        number = state.occurrences + 1
        closed = issue.state == "closed"
        regression = closed and (state.fixed_after_ms is None or e.culprit.start_unix_ms >= state.fixed_after_ms)
        if regression:
            self._note_once(ref, "regression-" + e.occurrence, body.regression_note(e, state.fixed_after_ms))
        elif number - 1 <= self.occurrence_notes:
            note = body.occurrence_note(e, number, last=number - 1 == self.occurrence_notes)
            self._note_once(ref, body.event_id(e), note)
        update: dict[str, Any] = {"description": body.with_state(text, state.with_occurrence(e))}
        if regression:
            update["state_event"] = "reopen"
        self._project.issues.update(ref.iid, update)
        self.counters["occurrences"] += 1
        if regression:
            self.counters["reopened"] += 1
            log.info("gitlab.reopened", fingerprint=e.fingerprint, iid=ref.iid, occurrence=e.occurrence)

    def _close_fixed(self, ref: IssueRef, e: VerdictEvent) -> None:
        issue = self._project.issues.get(ref.iid)
        text = str(issue.description or "")
        state = body.IssueState.parse(text)
        verdict = body.event_id(e)
        if state is not None and verdict in state.verdicts:
            return  # applied before: a replayed verdict must not re-close a reopened regression
        update: dict[str, Any] = {"state_event": "close"}
        if state is not None:
            update["description"] = body.with_state(text, state.with_fix(verdict, e.receipt.window_start_unix_ms))
        self._project.issues.update(ref.iid, update)
        self.counters["closed"] += 1
        log.info("gitlab.closed", fingerprint=e.fingerprint, iid=ref.iid, outcome=e.outcome)

    def _has_note(self, ref: IssueRef, note_id: str) -> bool:
        if (ref.iid, note_id) in self._posted:
            return True
        tag = body.marker(note_id)
        notes = self._project.issues.get(ref.iid, lazy=True).notes.list(get_all=True)
        if any(str(n.body).startswith(tag) for n in notes):
            self._posted.add((ref.iid, note_id))
            return True
        return False

    def _note_once(self, ref: IssueRef, note_id: str, text: str) -> bool:
        """Post ``text`` (which starts with the marker of ``note_id``) unless a note with that marker exists."""
        if self._has_note(ref, note_id):
            return False
        self._project.issues.get(ref.iid, lazy=True).notes.create({"body": text})
        self._posted.add((ref.iid, note_id))
        self.counters["notes"] += 1
        return True

    def _upload(self, filename: str, data: str) -> str:
        safe = _FILENAME.sub("_", filename).strip("._") or "attachment.txt"
        result: dict[str, Any] = self._project.upload(safe, filedata=data.encode())
        self.counters["uploads"] += 1
        return str(result["markdown"])

    def _repro_note(self, ref: IssueRef, e: ReproEvent) -> None:
        note_id = body.event_id(e)
        if self._has_note(ref, note_id):
            return
        test_link = self._upload(posixpath.basename(e.test_path) or "test_repro.py", e.test_source)
        patch_link = self._upload(f"trace-repro-{e.fingerprint}.patch", e.patch) if e.patch else None
        self._note_once(ref, note_id, body.repro_note(e, test_link, patch_link))

    # ---- merge requests ---------------------------------------------------------------------------------------

    def _file(self, path: str, ref: str) -> str | None:
        try:
            raw: bytes = self._project.files.raw(file_path=path, ref=ref)
        except GitlabError as exc:
            if exc.response_code == 404:
                return None
            raise
        return raw.decode()

    def _merge_request(self, ref: IssueRef, e: ReproEvent) -> None:
        branch = f"trace-repro/{e.fingerprint}"
        target = self.target_branch or str(self._project.default_branch or "main")
        existing = self._project.mergerequests.list(source_branch=branch, state="opened", get_all=True)
        if existing:
            mr_iid = int(existing[0].iid)
        else:
            try:
                self._project.branches.get(branch)
            except GitlabError as exc:
                if exc.response_code != 404:
                    raise
                self._project.branches.create({"branch": branch, "ref": target})
            applied, patch_path, wanted = self._repaired_files(e, target)
            actions = []
            for path, content in wanted.items():
                current = self._file(path, branch)
                if current == content:
                    continue  # committed by an earlier attempt
                if content is None:
                    actions.append({"action": "delete", "file_path": path})
                else:
                    kind = "create" if current is None else "update"
                    actions.append({"action": kind, "file_path": path, "content": content})
            if actions:
                self._project.commits.create({"branch": branch, "actions": actions,
                                              "commit_message": f"trace-repro: prove #{ref.iid}"})  # fmt: skip
            try:
                mr = self._project.mergerequests.create({
                    "source_branch": branch, "target_branch": target,
                    "title": title_text(f"Prove #{ref.iid}: {e.test_path}"),
                    "description": body.merge_request_description(e, ref.iid, applied=applied, patch_path=patch_path),
                    "labels": list(self.labels),
                })  # fmt: skip
            except GitlabError as exc:
                if exc.response_code != 409:
                    raise
                # Opened meanwhile by another instance.
                mr = self._project.mergerequests.list(source_branch=branch, state="opened", get_all=True)[0]
            mr_iid = int(mr.iid)
            self.counters["merge_requests"] += 1
            log.info("gitlab.merge_request", fingerprint=e.fingerprint, iid=mr_iid, issue=ref.iid)
        self._note_once(ref, f"merge-request-{branch}", body.merge_request_note(mr_iid, branch))

    def _repaired_files(self, e: ReproEvent, target: str) -> tuple[bool, str | None, dict[str, str | None]]:
        """(patch applied?, path of the patch file if not, path -> content to commit (None = delete))."""
        wanted: dict[str, str | None] = {e.test_path: e.test_source}
        if not e.patch:
            return True, None, wanted
        try:
            changed: dict[str, str | None] = {}
            for fp in patching.parse(e.patch):
                before = self._file(fp.old_path, target) if fp.old_path else None
                changed[fp.path] = patching.apply(before, fp)
            wanted.update(changed)
            return True, None, wanted
        except patching.PatchError as exc:
            log.warning("gitlab.patch_not_applied", fingerprint=e.fingerprint, error=str(exc)[:200])
            path = f".trace-repro/{e.fingerprint}.patch"
            wanted[path] = e.patch
            return False, path, wanted

    # ---- secrets ----------------------------------------------------------------------------------------------

    def _redact(self, text: str) -> str:
        return text.replace(self._secret, "**********") if self._secret else text


__all__ = ["DEFAULT_LABELS", "GitLabPermanentError", "GitLabRetryableError", "GitLabSink", "IssueRef"]
