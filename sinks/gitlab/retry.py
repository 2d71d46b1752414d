"""Bounded, jittered exponential backoff for GitLab calls, honouring ``Retry-After``.

python-gitlab's own retry loop sleeps with ``time.sleep`` and cannot be observed, so it is switched off: the
transport (:class:`TransientHTTPError`, raised by the sink's requests backend) turns every 429 and 5xx into an
exception that carries the ``Retry-After`` header, and :class:`Retrier` retries the whole *step* (an idempotent
unit of one or more calls, see :mod:`sinks.gitlab.issues`) with an injectable async ``sleep``.

Classification (:func:`classify`):

- 429, 5xx, timeouts and connection errors are *transient*; they are retried at most ``max_attempts`` times per
  step, waiting ``Retry-After`` when the server sent one (never less) and a jittered exponential delay otherwise.
  Exhaustion raises :class:`GitLabRetryableError` (a ``sinks.base.RetryableSinkError`` whose ``retry_after_s`` is
  the last ``Retry-After``): the caller must not commit its input offsets and must try again later. A
  ``Retry-After`` longer than ``max_retry_after_s`` (``[gitlab]``, two minutes by default; also ``inf`` or an HTTP
  date far ahead) fails the step at once, and the caller is told to wait ``max_retry_after_s``, never longer: a
  server's hint can delay the sink, never wedge it. A negative value or a date in the past means now; NaN or garbage
  is no hint at all.
- 401 and 403 (the token expired, was revoked or lost its rights) and 404 on the project itself (moved or deleted:
  GitLab answers ``404 Project Not Found``, or any 404 to the step that loads the project) are about the
  destination, not about one event: they raise :class:`GitLabParkedError` at once (a retryable error with
  ``parked = True``). The sink keeps every event and the runtime parks it until a probe sees GitLab accept it again.
- Any other 4xx (400, 422: this event's content; 409, 413, ...) is *permanent* (:class:`GitLabPermanentError`):
  retrying the same request cannot succeed, so that one event is dropped. An exception that is not an HTTP or
  transport error is permanent too.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import NamedTuple, TypeVar

import requests
import structlog
from gitlab.exceptions import GitlabError

from processors.model.base import Published
from sinks.base import PermanentSinkError, RetryableSinkError

log = structlog.get_logger("trace_repro.gitlab")

T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None]]
Redact = Callable[[str], str]


class GitLabError(RuntimeError):
    """Base class of the sink's errors."""


class GitLabRetryableError(GitLabError, RetryableSinkError):
    """GitLab stayed unavailable for every attempt: keep the input uncommitted and retry it later.

    ``retry_after_s`` is GitLab's last ``Retry-After``, when it sent one.
    """


class GitLabParkedError(GitLabRetryableError):
    """GitLab refuses the sink as a whole (401, 403, or 404 on the project): no event can be delivered until the
    token, its rights or the project are fixed. Retryable, with ``parked = True``: keep every event, probe, resume.
    """

    parked = True

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class GitLabPermanentError(GitLabError, PermanentSinkError):
    """GitLab rejected a request (a 4xx other than 429): retrying it unchanged cannot succeed."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.event: Published | None = None  # the event the sink dropped, set by ``GitLabSink.flush``


class TransientHTTPError(Exception):
    """A 429 or 5xx response, raised by the transport before python-gitlab's own retry loop sees it."""

    def __init__(self, status: int, retry_after: float | None, method: str) -> None:
        super().__init__(f"HTTP {status} on {method.upper()}")
        self.status = status
        self.retry_after = retry_after


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date), or None if absent or invalid.

    Never negative (a negative delay or a date in the past is 0) and never NaN; it may be huge or infinite (``inf``,
    a date centuries ahead): :class:`Retrier` caps it at ``RetryPolicy.max_retry_after_s``.
    """
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        return None if math.isnan(seconds) else max(0.0, seconds)
    try:
        left: float = parsedate_to_datetime(text).timestamp() - (time.time() if now is None else now)
    except (TypeError, ValueError, OverflowError):
        return None
    return max(0.0, left)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How hard one step is retried before the sink gives up with :class:`GitLabRetryableError`."""

    max_attempts: int = 5
    base_s: float = 0.5
    max_backoff_s: float = 30.0
    max_retry_after_s: float = 120.0  # the longest Retry-After honoured; a longer one fails the step at once

    def backoff(self, attempt: int, rng: random.Random) -> float:
        """Equal-jitter exponential delay before retry number ``attempt`` (1-based)."""
        ceiling: float = min(self.max_backoff_s, self.base_s * 2.0 ** (attempt - 1))
        return ceiling / 2 + rng.uniform(0, ceiling / 2)


class Classified(NamedTuple):
    """What :func:`classify` says about one failure."""

    transient: bool
    retry_after: float | None
    what: str  # a short description without URLs, headers or bodies
    parks: bool = False  # about the destination as a whole (auth, project): park the sink


PARKING_STATUSES = (401, 403)


def classify(exc: BaseException, *, op: str = "") -> Classified:
    """Transient, parking or permanent (see the module docstring); ``op`` is the step's name (``project`` loads
    the project, so any 404 to it means the project is gone)."""
    if isinstance(exc, TransientHTTPError):
        return Classified(True, exc.retry_after, f"http {exc.status}")
    if isinstance(exc, requests.Timeout):
        return Classified(True, None, "timeout")
    if isinstance(exc, requests.ConnectionError | requests.exceptions.ChunkedEncodingError):
        return Classified(True, None, "connection error")
    if isinstance(exc, GitlabError):
        code = exc.response_code
        if code is not None and (code == 429 or code >= 500):
            return Classified(True, None, f"http {code}")
        if code in PARKING_STATUSES:
            return Classified(False, None, f"http {code}", parks=True)
        if code == 404 and (op == "project" or "project not found" in _message(exc).lower()):
            return Classified(False, None, "http 404 (project)", parks=True)
        return Classified(False, None, f"http {code}" if code is not None else type(exc).__name__)
    return Classified(False, None, type(exc).__name__)


class Retrier:
    """Runs synchronous steps in a worker thread, retrying transient failures per :class:`RetryPolicy`."""

    def __init__(
        self,
        policy: RetryPolicy,
        *,
        sleep: Sleep = asyncio.sleep,
        rng: random.Random | None = None,
        redact: Redact = lambda s: s,
        on_retry: Callable[[str], None] = lambda op: None,
    ) -> None:
        self.policy = policy
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.redact = redact
        self.on_retry = on_retry  # called with the step's name before each retry (the sink counts them)
        self.retries = 0

    async def run(self, step: Callable[[], T], *, op: str) -> T:
        """Run ``step`` until it succeeds, fails permanently, or ``max_attempts`` transient failures happened."""
        attempt = 0
        while True:
            attempt += 1
            try:
                return await asyncio.to_thread(step)
            except Exception as exc:
                transient, retry_after, what, parks = classify(exc, op=op)
                if parks:
                    status = getattr(exc, "response_code", None)
                    raise GitLabParkedError(self.redact(f"gitlab {op}: {what}: {_message(exc)}"), status) from None
                if not transient:
                    message = self.redact(f"gitlab {op}: {what}: {_message(exc)}")
                    log.error("gitlab.rejected", op=op, error=what)
                    raise GitLabPermanentError(message, getattr(exc, "response_code", None)) from None
                if retry_after is not None and retry_after > self.policy.max_retry_after_s:
                    capped = self.policy.max_retry_after_s  # inf, or a date far ahead, must not wedge the sink
                    log.warning("gitlab.unavailable", op=op, error=what, retry_after_s=retry_after, waits_s=capped)
                    raise GitLabRetryableError(
                        f"gitlab {op}: {what}, retry after {retry_after:.0f} s (waiting {capped:.0f} s)",
                        retry_after_s=capped,
                    ) from None
                if attempt >= self.policy.max_attempts:
                    log.warning("gitlab.unavailable", op=op, error=what, attempts=attempt)
                    raise GitLabRetryableError(
                        f"gitlab {op}: {what} after {attempt} attempts", retry_after_s=retry_after
                    ) from None
                wait = self.policy.backoff(attempt, self.rng)
                if retry_after is not None:
                    wait = max(wait, retry_after)
                self.retries += 1
                self.on_retry(op)
                log.warning("gitlab.retry", op=op, error=what, attempt=attempt, wait_s=round(wait, 3))
            await self.sleep(wait)


def _message(exc: BaseException) -> str:
    text = getattr(exc, "error_message", None) or str(exc)
    return str(text)[:300]


__all__ = [
    "PARKING_STATUSES",
    "Classified",
    "GitLabError",
    "GitLabParkedError",
    "GitLabPermanentError",
    "GitLabRetryableError",
    "Retrier",
    "RetryPolicy",
    "TransientHTTPError",
    "classify",
    "parse_retry_after",
]
