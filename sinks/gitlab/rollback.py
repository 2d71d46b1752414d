"""What a WORSE verdict does: roll the environment back (GitLab's deployments) or call a webhook; once per verdict.

``[gitlab] rollback`` chooses:

- ``deployments``: GitLab's own rollback, which re-runs the deploy job of an earlier deployment. The sink lists the
  ``rollback_environment``'s newest 100 deployments, finds the one of the WORSE build's commit, and retries
  the deployable job of the newest *successful* deployment before it with another commit
  (``POST /projects/:id/jobs/:job_id/retry``); GitLab re-deploys that build as a new deployment. Nothing is re-run
  when no deployment of the commit is found (a build told by version with no commit, another environment), when
  no earlier successful deployment exists, or when a newer deployment already replaced the WORSE build (a deploy
  made since; a newer deployment of the rollback's target is this rollback, started by an attempt whose answer was
  lost): the note says which.
- ``webhook``: an HTTP POST of the verdict (its receipt included) as JSON to ``rollback_webhook_url``, with an
  ``Idempotency-Key`` header (the verdict's id: a receiver that keeps it acts once) and, when
  ``rollback_webhook_secret_env`` names an environment variable, its value in ``rollback_webhook_header`` (never
  logged: the sink redacts it from every error text). 2xx is done; 429 and 5xx are retried like GitLab's own
  answers; another status refuses the rollback (noted, counted ``rollback_refused``).

**Once per verdict, across restarts**: what was done is recorded as a note on the defect's issue, whose hidden
marker is the verdict's id; a replayed WORSE verdict whose note exists does nothing. Between the action and the
note (a crash, a failed note), the deployments rule sees the newer deployment and re-runs nothing; the webhook's
receiver sees the same ``Idempotency-Key``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import requests

from processors.model.outputs import VerdictEvent
from sinks.gitlab.escape import code
from sinks.gitlab.markdown import event_id, marker
from sinks.gitlab.retry import TransientHTTPError, parse_retry_after

LIVE = ("created", "running", "success", "blocked")  # deployments that are (or are becoming) what runs


@dataclass(frozen=True, slots=True)
class RollbackHook:
    """How a WORSE verdict rolls back (``kind``: "deployments" or "webhook"); the secret stays out of ``repr``."""

    kind: str
    environment: str = ""
    url: str = ""
    header: str = ""
    secret: str = field(default="", repr=False)
    timeout_s: float = 10.0


class WebhookRefused(Exception):
    """The webhook answered a status that is not 2xx, 429 or 5xx (``response_code`` for the sink's classifier)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"webhook answered http {status}")
        self.response_code = status


def note_id(e: VerdictEvent) -> str:
    return event_id(e) + "-rollback"


def rollback_step(hook: RollbackHook, project: Any, e: VerdictEvent) -> tuple[bool, str]:
    """Roll back for ``e`` (one retryable step): (whether something was re-run or called, what, in words)."""
    if hook.kind == "webhook":
        return True, _webhook(hook, e)
    return _redeploy(project, hook.environment, e.commit)


def _redeploy(project: Any, environment: str, commit: str) -> tuple[bool, str]:
    where = f"environment {code(environment)}"
    if not commit:
        return False, f"not rolled back: the build names no commit to find its deployment in {where}"
    found = project.deployments.list(environment=environment, order_by="id", sort="desc", per_page=100,
                                     get_all=False)  # fmt: skip
    live = [d for d in found if d.status in LIVE]
    bad = next((i for i, d in enumerate(live) if d.sha == commit), None)
    if bad is None:
        return False, f"not rolled back: no deployment of {code(commit[:12])} in {where}"
    target = next((d for d in live[bad + 1 :] if d.status == "success" and d.sha != commit), None)
    if bad > 0:
        newer = live[0]
        if target is not None and newer.sha == target.sha:  # this rollback, started by an attempt whose answer was lost
            return True, (f"rolled back {where} to {code(target.sha[:12])}: deployment #{newer.iid} "
                          f"({newer.status}) re-deploys it")  # fmt: skip
        return False, (f"not rolled back: deployment #{newer.iid} of {code(newer.sha[:12])} ({newer.status}) replaced "
                       f"the WORSE build in {where} (a deploy since)")  # fmt: skip
    if target is None:
        return False, f"not rolled back: no successful deployment before {code(commit[:12])} in {where}"
    job = project.jobs.get(target.deployable["id"], lazy=True).retry()
    return True, (f"rolled back {where} to {code(target.sha[:12])} ({code(target.ref)}, deployment #{target.iid}): "
                  f"re-ran its deploy job {target.deployable['id']} as job {job.get('id')}")  # fmt: skip


def _webhook(hook: RollbackHook, e: VerdictEvent) -> str:
    headers = {"Content-Type": "application/json", "Idempotency-Key": event_id(e), "User-Agent": "trace-repro"}
    if hook.secret and hook.header:
        headers[hook.header] = hook.secret
    body = json.dumps({"event": "rollback", "verdict": e.model_dump(mode="json")}, sort_keys=True)
    answer = requests.post(hook.url, data=body.encode(), headers=headers, timeout=hook.timeout_s,
                           allow_redirects=False)  # fmt: skip
    status = answer.status_code
    if status == 429 or status >= 500:
        raise TransientHTTPError(status, parse_retry_after(answer.headers.get("Retry-After")), "POST")
    if not 200 <= status < 300:
        raise WebhookRefused(status)
    return f"rollback webhook called: http {status}"


def rollback_note(e: VerdictEvent, acted: bool, what: str) -> str:
    """The note that records what a WORSE verdict did (its marker keeps it, and the rollback, to once)."""
    head = "Rolled back" if acted else "Rollback not done"
    return f"{marker(note_id(e))}\n### {head} after **WORSE** on {code(e.service)} {code(e.version)}\n\n{what}\n"


__all__ = ["RollbackHook", "WebhookRefused", "note_id", "rollback_note", "rollback_step"]
