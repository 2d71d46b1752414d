"""The GitLab sink: one issue per finding's fingerprint, kept up to date by later events.

What each kind does (the issue mechanics are in :mod:`sinks.gitlab.issues`):

- every finding (incident, regression, ``FindingEvent`` of any type) files the issue of its fingerprint in its
  registered body (:mod:`sinks.gitlab.body`), or counts a later occurrence in it (a note for the first
  ``occurrence_notes`` repeats; a closed issue is reopened, unless the occurrence predates its verified fix);
- ``ReproEvent`` adds a note with RED/GREEN, the divergence report, and the uploaded test file and patch; with
  ``merge_requests=True`` a proven repro also opens the "Proves #N" merge request
  (:mod:`sinks.gitlab.merge_requests`);
- ``VerdictEvent`` adds a note with its receipt; a FIXED verdict closes the issue (a regression's too: the proof
  desk gives every regression fingerprint a contract, and its verdicts carry that fingerprint). A regression
  reopens its closed issue only when its build was first seen after the verified fix (:mod:`sinks.gitlab.state`).
  A FIXED verdict on a tagged build also adds its receipt to the tag's release (:mod:`sinks.gitlab.releases`,
  ``releases=True``); a WORSE verdict rolls back with the configured hook (:mod:`sinks.gitlab.rollback`), once.

Other kinds are ignored. A repro or verdict whose fingerprint never got an issue is dropped (``orphan``).

**Nothing lost, nothing twice.** :meth:`GitLabSink.write` queues (each ``Published.event_id`` once: an event
already queued is skipped and counted as ``duplicates``), :meth:`GitLabSink.flush` delivers the queue in order.
Each delivery is a series of idempotent *steps*, each retried as a whole by :class:`~sinks.gitlab.retry.Retrier`
(429, 5xx, timeouts, dropped connections; bounded attempts; ``Retry-After`` honoured). On exhaustion ``flush``
raises :class:`~sinks.gitlab.retry.GitLabRetryableError` (a ``RetryableSinkError`` carrying GitLab's
``Retry-After`` as ``retry_after_s``) and keeps the event queued: the runtime must not commit its offsets, and may
call ``flush`` again or replay the input later. A permanent error (400, 422, ...: about that event) drops the event
from the queue, counts it (``rejected``) and raises :class:`~sinks.gitlab.retry.GitLabPermanentError` carrying it.

**Parking.** 401, 403 and 404 on the project say that GitLab refuses the sink as a whole (expired or revoked
token, lost rights, project moved or deleted). ``flush`` then keeps the event and everything after it, marks the
sink :attr:`GitLabSink.parked` (logged once when it parks and once when it resumes) and raises
:class:`~sinks.gitlab.retry.GitLabParkedError` (retryable, ``parked = True``); the sink runner stops committing,
probes :meth:`GitLabSink.healthcheck` and flushes again once it passes, which delivers the kept events in order.
The queue is bounded (``max_queued``): past it ``write`` refuses the event with :class:`GitLabQueueFull`
(retryable) and counts a ``max_queued`` drop; the runtime reads that event again from Kafka later. With
``token_file`` the token is read from that file, again by every health check, so a rotated token (a Kubernetes
secret volume, a vault agent) un-parks the sink without a restart.

**Telemetry** goes to the :class:`~processors.api.telemetry.Telemetry` given (the factory passes the component's):
drops ``rejected``, ``orphan``, ``max_queued`` and ``rollback_refused``; counts ``issues_created``, ``occurrences``,
``notes``, ``reopened``, ``closed``, ``duplicates_closed``, ``uploads``, ``merge_requests``, ``retries``,
``duplicates``, ``parked``, ``resumed``, ``token_reloads``, ``releases``, ``rollbacks``, ``rollbacks_skipped``,
``contracts_edited``, ``contracts_invalid``, ``contracts_published``; the state gauge ``queued``. **Contracts**: an
issue's contract section, edited by a person, becomes the contract (:mod:`sinks.gitlab.contract_sync`).

**The token** is a ``SecretStr`` unwrapped only into python-gitlab's ``PRIVATE-TOKEN`` header; log lines carry
operation names and status codes only, error texts are redacted (of every token the sink has held), and
python-gitlab's debug mode is never enabled.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import gitlab
import structlog
from gitlab._backends.requests_backend import RequestsBackend, RequestsResponse
from pydantic import SecretStr

from processors.api.telemetry import Telemetry
from processors.model.outputs import Finding, Published, ReproEvent, VerdictEvent
from sinks.base import RetryableSinkError, Sink
from sinks.gitlab.body_verdict import verdict_note
from sinks.gitlab.contract_sync import ContractPublisher, IssueContracts
from sinks.gitlab.issues import IssueRef, Issues
from sinks.gitlab.links import Links
from sinks.gitlab.markdown import Event, Filed, event_id
from sinks.gitlab.merge_requests import MergeRequests
from sinks.gitlab.releases import release_step
from sinks.gitlab.retry import (
    GitLabParkedError,
    GitLabPermanentError,
    GitLabRetryableError,
    Retrier,
    RetryPolicy,
    Sleep,
    TransientHTTPError,
    classify,
    parse_retry_after,
)
from sinks.gitlab.rollback import RollbackHook, WebhookRefused, note_id, rollback_note, rollback_step

log = structlog.get_logger("trace_repro.gitlab")

T = TypeVar("T")
DEFAULT_LABELS = ("trace-repro",)
KINDS = (Finding, ReproEvent, VerdictEvent)  # every finding (incidents, regressions, any registered type)


class _Transport(RequestsBackend):
    """python-gitlab's requests backend, raising 429 and 5xx (with ``Retry-After``) to our retry loop."""

    def http_request(self, method: str, url: str, *args: Any, **kwargs: Any) -> RequestsResponse:
        result: RequestsResponse = super().http_request(method, url, *args, **kwargs)
        status = result.status_code
        if status == 429 or status >= 500:
            raise TransientHTTPError(status, parse_retry_after(result.headers.get("Retry-After")), method)
        return result


class GitLabQueueFull(RetryableSinkError):
    """``write`` refused an event: ``max_queued`` events wait already (the sink is parked or GitLab is down)."""


class GitLabSink(Sink):
    """Files findings as GitLab issues and keeps them current; see the module docstring."""

    name = "gitlab"

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
        max_queued: int = 1000,
        token_file: str | Path | None = None,
        confidential: bool = False,
        links: Links | None = None,
        rollback: RollbackHook | None = None,
        releases: bool = False,
        sleep: Sleep = asyncio.sleep,
        rng: random.Random | None = None,
        telemetry: Telemetry | None = None,
        publish: Callable[[Published], Awaitable[None]] | None = None,
        contract_poll_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_queued < 1:
            raise ValueError("max_queued must be >= 1")
        self._url, self._timeout_s, self._ssl_verify = url, timeout_s, ssl_verify
        self._token_file = Path(token_file) if token_file else None
        self._secret = token.get_secret_value()
        self._secrets = {self._secret} if self._secret else set()  # every token held: all are redacted
        self.rollback, self.releases = rollback, releases
        if rollback is not None and rollback.secret:
            self._secrets.add(rollback.secret)  # the webhook's secret: redacted from error texts as the token is
        self._gl = self._client(self._secret)
        self._project_ref = project
        self.labels = tuple(dict.fromkeys(labels))
        self.merge_requests = merge_requests
        self.max_queued = max_queued
        self.telemetry = (telemetry or Telemetry(self.name)).declare("rejected", "orphan", "max_queued",
                                                                     "rollback_refused")  # fmt: skip
        policy = RetryPolicy(max_attempts=max_attempts, base_s=backoff_s, max_backoff_s=max_backoff_s,
                             max_retry_after_s=max_retry_after_s)  # fmt: skip
        self._retrier = Retrier(policy, sleep=sleep, rng=rng, redact=self._redact,
                                on_retry=lambda _op: self.telemetry.count("retries"))  # fmt: skip
        self._issues = Issues(labels=self.labels, occurrence_notes=occurrence_notes, telemetry=self.telemetry,
                              confidential=confidential, links=links)  # fmt: skip
        self._mrs = MergeRequests(self._issues, target_branch=target_branch, telemetry=self.telemetry)
        self._contracts = ContractPublisher(IssueContracts(self._issues), publish, poll_s=contract_poll_s, clock=clock,
                                            telemetry=self.telemetry)  # fmt: skip
        self._poll_task: asyncio.Task[None] | None = None
        self._queue: deque[Event] = deque()
        self._queued: set[str] = set()  # event ids in the queue
        self._lock = asyncio.Lock()
        self._labels_ready = False
        self.parked: str | None = None  # why the sink is parked ("http 401" ...), None while it delivers
        self._healthy: bool | None = None  # the last health check's answer, to log changes only

    def _client(self, secret: str) -> gitlab.Gitlab:
        return gitlab.Gitlab(self._url, private_token=secret, timeout=self._timeout_s, ssl_verify=self._ssl_verify,
                             retry_transient_errors=False, backend=_Transport)  # fmt: skip

    def __repr__(self) -> str:
        return f"GitLabSink(url={self._gl.url!r}, project={self._project_ref!r}, token=SecretStr('**********'))"

    # ---- Sink -------------------------------------------------------------------------------------------------

    async def write(self, event: Published) -> None:
        """Queue ``event`` if it is a kind this sink files and not queued already; :meth:`flush` delivers it.

        Raises :class:`GitLabQueueFull` (and counts a ``max_queued`` drop) when ``max_queued`` events wait.
        """
        if not isinstance(event, KINDS):
            return
        key = event.event_id  # every kind filed here has identity fields
        if key in self._queued:
            self.telemetry.count("duplicates")
            return
        if len(self._queue) >= self.max_queued:
            self.telemetry.drop("max_queued")
            raise GitLabQueueFull(f"gitlab: {len(self._queue)} events queued (max_queued)")
        self._queue.append(event)
        self._queued.add(key)
        self.telemetry.gauge("queued", len(self._queue))

    @property
    def pending(self) -> int:
        """Events written and not delivered yet."""
        return len(self._queue)

    async def flush(self) -> None:
        """Deliver every queued event in order; on a retryable failure the rest stays queued (see module doc)."""
        async with self._lock:
            if self.parked is not None:
                self._reload_token()
            while self._queue:
                event = self._queue[0]
                try:
                    await self._deliver(event)
                except GitLabParkedError as exc:
                    self._park(exc)
                    raise
                except GitLabPermanentError as exc:
                    self._pop()
                    self.telemetry.drop("rejected")
                    exc.event = event
                    raise
                self._pop()
                if self.parked is not None:  # GitLab took an event again
                    self._resume()
            if self._contracts.due():
                await self._contracts.poll(self._run, self._load_project)

    async def _poll_when_idle(self) -> None:
        """The contracts' poll from the periodic health check, between flushes (the sink's lock)."""
        async with self._lock:
            if self._contracts.due() and self.parked is None:
                await self._contracts.poll(self._run, self._load_project)

    def _pop(self) -> None:
        self._queued.discard(self._queue.popleft().event_id)
        self.telemetry.gauge("queued", len(self._queue))

    def _park(self, exc: GitLabParkedError) -> None:
        """Enter (or stay in) the parked state; the project is loaded again on resumption."""
        reason = f"http {exc.status}" if exc.status is not None else "refused"
        self._issues.project = None
        self._labels_ready = False
        if exc.status == 404:
            self._issues.known.clear()  # a moved or recreated project has other issues
        if self.parked is None:
            self.telemetry.count("parked")
            log.warning("gitlab.parked", reason=reason, queued=len(self._queue), project=str(self._project_ref))
        self.parked = reason

    def _resume(self) -> None:
        log.info("gitlab.resumed", was=self.parked, queued=len(self._queue))
        self.telemetry.count("resumed")
        self.parked = None

    async def healthcheck(self) -> bool:
        """One unretried request for the project: is GitLab reachable with this token? (The token file, if any, is
        read again first.) Logged when the answer changes."""
        self._reload_token()
        try:
            await asyncio.to_thread(self._probe_project)
            ok, error = True, ""
        except Exception as exc:
            ok, error = False, classify(exc, op="project").what
        if ok and self._contracts.due() and (self._poll_task is None or self._poll_task.done()):
            self._poll_task = asyncio.create_task(self._poll_when_idle())  # not awaited: the check stays short
        if ok != self._healthy:
            if ok:
                log.info("gitlab.healthy")
            else:
                log.warning("gitlab.unhealthy", error=error)
        self._healthy = ok
        return ok

    async def close(self) -> None:
        if self._poll_task is not None:
            self._poll_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poll_task
        await asyncio.to_thread(self._gl.session.close)

    def issue_url(self, fingerprint: str) -> str | None:
        """The web URL of the fingerprint's issue, once this sink has filed or found it."""
        ref = self._issues.known.get(fingerprint)
        return ref.web_url if ref else None

    def issue_iid(self, fingerprint: str) -> int | None:
        """The iid of the fingerprint's issue, once this sink has filed or found it."""
        ref = self._issues.known.get(fingerprint)
        return ref.iid if ref else None

    # ---- delivery ---------------------------------------------------------------------------------------------

    async def _run(self, step: Callable[[], T], op: str) -> T:
        return await self._retrier.run(step, op=op)

    async def _deliver(self, event: Event) -> None:
        if self._issues.project is None:
            await self._run(self._load_project, "project")
        if not self._labels_ready:
            await self._run(self._issues.ensure_labels, "labels")
            self._labels_ready = True
        if isinstance(event, Finding):
            await self._filed(event)
        elif isinstance(event, ReproEvent):
            await self._repro(event)
        else:
            await self._verdict(event)

    async def _filed(self, e: Filed) -> None:
        issues = self._issues
        for attempt in (1, 2):
            ref, created = await self._run(lambda: issues.find_or_create(e), "issue.create")
            if created:
                log.info("gitlab.issue", fingerprint=e.fingerprint, type=e.finding_type(), iid=ref.iid, url=ref.web_url)
                return
            try:
                await self._run(functools.partial(issues.occurrence, ref, e), "issue.occurrence")
                await self._contracts.sync(self._run, ref)
                return
            except GitLabPermanentError as exc:
                if exc.status != 404 or attempt == 2:
                    raise
                issues.known.pop(e.fingerprint, None)  # deleted meanwhile: look it up (or file it) again

    async def _repro(self, e: ReproEvent) -> None:
        noted = await self._on_issue(e.fingerprint, "note.repro", lambda ref: self._issues.repro_note(ref, e))
        if noted and self.merge_requests and e.proven:
            await self._on_issue(e.fingerprint, "merge_request", lambda ref: self._mrs.prove(ref, e))

    async def _verdict(self, e: VerdictEvent) -> None:
        note = verdict_note(e)
        noted = await self._on_issue(
            e.fingerprint, "note.verdict", lambda ref: self._issues.note_once(ref, event_id(e), note)
        )
        if noted and e.outcome == "FIXED":
            await self._on_issue(e.fingerprint, "issue.close", lambda ref: self._issues.close_fixed(ref, e))
            if self.releases and (tag := await self._run(lambda: release_step(self._issues.project, e), "release")):
                self.telemetry.count("releases")
                log.info("gitlab.release", fingerprint=e.fingerprint, tag=tag)
        if noted and e.rollback and self.rollback is not None:  # (the judge sets it on WORSE)
            await self._on_issue(e.fingerprint, "rollback", lambda ref: self._roll_back(ref, e))

    def _roll_back(self, ref: IssueRef, e: VerdictEvent) -> None:
        """One step: nothing when the verdict's rollback note exists; else roll back and note what was done."""
        if self.rollback is None or self._issues.has_note(ref, note_id(e)):
            return
        try:
            acted, what = rollback_step(self.rollback, self._issues.project, e)
        except WebhookRefused as exc:
            self.telemetry.drop("rollback_refused")
            acted, what = False, f"not rolled back: the rollback webhook refused it (http {exc.response_code})"
        self.telemetry.count("rollbacks" if acted else "rollbacks_skipped")
        log.warning("gitlab.rollback", fingerprint=e.fingerprint, version=e.version, acted=acted)
        self._issues.note_once(ref, note_id(e), rollback_note(e, acted, what))

    async def _on_issue(self, fingerprint: str, op: str, step: Callable[[IssueRef], object]) -> bool:
        """Run ``step`` on the fingerprint's issue; False (and nothing done) when no issue was ever filed."""
        issues = self._issues
        for attempt in (1, 2):
            ref = issues.known.get(fingerprint) or await self._run(lambda: issues.lookup(fingerprint), "issue.lookup")
            if ref is None:
                self.telemetry.drop("orphan")
                log.warning("gitlab.no_issue", fingerprint=fingerprint, op=op)  # its issue was never filed
                return False
            try:
                await self._run(functools.partial(step, ref), op)
                return True
            except GitLabPermanentError as exc:
                if exc.status != 404 or attempt == 2:
                    raise
                issues.known.pop(fingerprint, None)  # deleted meanwhile: look it up again
        return False

    def _load_project(self) -> None:
        if self._issues.project is None:
            self._issues.project = self._gl.projects.get(self._project_ref)

    def _probe_project(self) -> None:
        self._gl.projects.get(self._project_ref)

    def _reload_token(self) -> None:
        """Take the token from ``token_file`` if it changed (a rotated token); a missing file changes nothing."""
        if self._token_file is None:
            return
        try:
            secret = self._token_file.read_text().strip()
        except OSError as exc:
            log.warning("gitlab.token_file_unreadable", error=type(exc).__name__)
            return
        if not secret or secret == self._secret:
            return
        self._secrets.add(secret)
        self._secret = secret
        self._gl = self._client(secret)  # (a step still running on the old client finishes with it)
        self._issues.project = None  # python-gitlab objects are bound to the client (and its token)
        self._labels_ready = False
        self.telemetry.count("token_reloads")
        log.info("gitlab.token_reloaded")

    def _redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "**********")
        return text


__all__ = [
    "DEFAULT_LABELS",
    "GitLabParkedError",
    "GitLabPermanentError",
    "GitLabQueueFull",
    "GitLabRetryableError",
    "GitLabSink",
    "IssueRef",
]
