"""Verdicts that act, against the local GitLab server: WORSE rolls back (deployments or a webhook), FIXED releases."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from bench.gitlab_deploys import deployments, releases, seed_deployment, seed_tag
from bench.gitlab_server import FakeGitLab
from processors.api.telemetry import Telemetry
from sinks.gitlab.body_verdict import verdict_note
from sinks.gitlab.config import GitLabConfig
from sinks.gitlab.factory import rollback_hook
from sinks.gitlab.rollback import RollbackHook
from tests.gitlab.conftest import SinkFactory
from tests.gitlab.helpers import deliver, incident, user_notes, verdict

GOOD, BAD, OTHER = "a" * 40, "b" * 40, "c" * 40
ENV = "production"
SECRET = "hook-s3cr3t-41f7"


def worse(commit: str = BAD, version: str = "1.4.3") -> Any:
    return verdict(outcome="WORSE", rollback=True, commit=commit, version=version,
                   reason="1.4.3 fails 40/1000 requests vs 3/1000 on 1.4.2: worse overall, roll back")  # fmt: skip


def retries(server: FakeGitLab) -> list[str]:
    return [path for method, path in server.requests if method == "POST" and path.endswith("/retry")]


async def test_worse_re_runs_the_deploy_job_of_the_last_good_deployment_once(
    server: FakeGitLab, make_sink: SinkFactory
) -> None:
    """GitLab's rollback: the good build's deploy job is retried, a new deployment of it starts, a note says so;
    the same verdict again, even through a new sink (a restart), re-runs nothing and notes nothing more."""
    older = seed_deployment(server, ENV, OTHER)
    good = seed_deployment(server, ENV, GOOD, ref="v1.4.2")
    seed_deployment(server, ENV, "d" * 40, status="failed")
    seed_deployment(server, ENV, BAD, ref="v1.4.3")
    seed_deployment(server, "staging", GOOD)
    telemetry = Telemetry("gitlab")
    sink = make_sink(rollback=RollbackHook("deployments", ENV), telemetry=telemetry)
    await deliver(sink, incident(), worse())
    assert retries(server) == [f"/api/v4/projects/1/jobs/{good['deployable']['id']}/retry"]
    newest = deployments(server, ENV)[0]
    assert (newest["sha"], newest["status"]) == (GOOD, "running") and older["sha"] == OTHER
    [note] = [n for n in user_notes(server, 1) if "Rolled back" in n]
    assert f"to `{GOOD[:12]}` (`v1.4.2`" in note and str(good["deployable"]["id"]) in note
    assert telemetry.events["rollbacks"] == 1

    await deliver(make_sink(rollback=RollbackHook("deployments", ENV)), worse())
    assert len(retries(server)) == 1 and len([n for n in user_notes(server, 1) if "Rolled back" in n]) == 1


async def test_worse_rolls_back_nothing_it_cannot_place(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """No deployment of the WORSE commit, or a newer deployment over it: nothing re-run, the note says why."""
    seed_deployment(server, ENV, GOOD)
    seed_deployment(server, ENV, BAD)
    seed_deployment(server, ENV, OTHER)  # deployed since the WORSE build
    telemetry = Telemetry("gitlab")
    sink = make_sink(rollback=RollbackHook("deployments", ENV), telemetry=telemetry)
    await deliver(sink, incident(), worse(), worse(commit="e" * 40, version="1.4.4"))
    assert retries(server) == []
    notes = [n for n in user_notes(server, 1) if "Rollback not done" in n]
    assert any("replaced the WORSE build" in n for n in notes) and any(
        "no deployment of `eeeeeeeeeeee`" in n for n in notes
    )
    assert telemetry.events["rollbacks_skipped"] == 2


async def test_worse_rollback_waits_out_a_gitlab_outage(server: FakeGitLab, make_sink: SinkFactory) -> None:
    """503s on the deployments list and on the retry are retried with backoff; the rollback happens once."""
    seed_deployment(server, ENV, GOOD)
    seed_deployment(server, ENV, BAD)
    server.inject(r".*/deployments$", count=2, status=503)
    server.inject(r".*/retry$", count=1, status=502, apply=True)  # re-ran, answer lost
    sink = make_sink(rollback=RollbackHook("deployments", ENV))
    await deliver(sink, incident(), worse())
    assert [d["sha"] for d in deployments(server, ENV)] == [GOOD, BAD, GOOD]  # one re-deployment, not two
    [note] = [n for n in user_notes(server, 1) if "### Rolled back" in n]
    assert "re-deploys it" in note  # the retried step found the re-deployment its lost answer had started


class _Hook(BaseHTTPRequestHandler):
    answers: list[int] = []
    seen: list[tuple[dict[str, str], bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append((dict(self.headers.items()), body))
        status = self.answers.pop(0) if self.answers else 200
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def hook() -> Iterator[tuple[str, type[_Hook]]]:
    handler = type("Hook", (_Hook,), {"answers": [], "seen": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/rollback", handler
    httpd.shutdown()
    httpd.server_close()


async def test_worse_posts_the_receipt_to_the_webhook_once_with_its_secret(
    server: FakeGitLab,
    make_sink: SinkFactory,
    hook: tuple[str, type[_Hook]],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The verdict and its receipt as JSON, the secret from the environment in its header, an Idempotency-Key;
    a 503 is retried; a replay calls nothing; the secret is in no note and not in the hook's repr."""
    url, handler = hook
    handler.answers.extend([503])
    monkeypatch.setenv("DEPLOY_HOOK_SECRET", SECRET)
    config = GitLabConfig(url="http://gitlab", project="p", rollback="webhook", rollback_webhook_url=url,
                          rollback_webhook_secret_env="DEPLOY_HOOK_SECRET")  # fmt: skip
    rollback = rollback_hook(config)
    assert rollback is not None and SECRET not in repr(rollback)
    sink = make_sink(rollback=rollback)
    await deliver(sink, incident(), worse())
    assert len(handler.seen) == 2  # the 503, then the call that took
    headers, body = handler.seen[-1]
    doc = json.loads(body)
    assert doc["verdict"]["outcome"] == "WORSE" and doc["verdict"]["receipt"]["after_requests"] > 0
    assert (
        headers["X-Trace-Repro-Token"] == SECRET and headers["Idempotency-Key"] == handler.seen[0][0]["Idempotency-Key"]
    )
    await deliver(make_sink(rollback=rollback), worse())
    assert len(handler.seen) == 2
    assert any("rollback webhook called: http 200" in n for n in user_notes(server, 1))
    assert not any(SECRET in n for n in user_notes(server, 1))
    logged = capsys.readouterr()
    assert "gitlab.retry" in logged.out and SECRET not in logged.out + logged.err  # the 503 was logged, no secret


async def test_a_refused_webhook_is_noted_and_counted_not_retried(
    make_sink: SinkFactory, hook: tuple[str, type[_Hook]], server: FakeGitLab
) -> None:
    """A 403 from the webhook: one call, a note that says it refused, ``rollback_refused`` counted."""
    url, handler = hook
    handler.answers.extend([403])
    telemetry = Telemetry("gitlab")
    await deliver(make_sink(rollback=RollbackHook("webhook", url=url), telemetry=telemetry), incident(), worse())
    assert len(handler.seen) == 1 and telemetry.dropped["rollback_refused"] == 1
    assert any("refused it (http 403)" in n for n in user_notes(server, 1))


async def test_fixed_adds_the_receipt_to_the_tagged_builds_release_once(
    server: FakeGitLab, make_sink: SinkFactory
) -> None:
    """Version 1.4.3 is tag v1.4.3: its release is created with the receipt; an existing release of another tag
    gets the receipt appended; a replay changes neither; an untagged build gets no release."""
    seed_tag(server, "v1.4.3", GOOD)
    seed_tag(server, "1.5.0", OTHER)
    telemetry = Telemetry("gitlab")
    sink = make_sink(releases=True, telemetry=telemetry)
    await deliver(sink, incident(), verdict())
    [release] = releases(server)
    assert release["tag_name"] == "v1.4.3" and "proof of fix" in release["description"]
    assert "FIXED" in release["description"] and "1840 requests" in release["description"]

    server.store.data["releases"].append({"tag_name": "1.5.0", "name": "1.5.0", "description": "Notes by people."})
    await deliver(sink, verdict(version="1.5.0", commit=OTHER), verdict(version="9.9.9", commit="f" * 40))
    await deliver(make_sink(releases=True), verdict(), verdict(version="1.5.0", commit=OTHER))  # replays
    by_tag = {r["tag_name"]: r["description"] for r in releases(server)}
    assert set(by_tag) == {"v1.4.3", "1.5.0"}
    assert by_tag["1.5.0"].startswith("Notes by people.\n\n## trace-repro: proof of fix")
    assert by_tag["1.5.0"].count("proof of fix") == 1 and by_tag["v1.4.3"].count("proof of fix") == 1
    assert telemetry.events["releases"] == 2


def test_the_verdict_note_says_how_the_build_was_identified() -> None:
    """A receipt that names how its build was told apart shows it; one that does not (older events) shows nothing."""
    e = verdict()
    assert "Build identified by" not in verdict_note(e)
    marked = e.model_copy(update={"receipt": e.receipt.model_copy(update={"build_identified_by": "mark"})})
    assert "| Build identified by | `mark` |" in verdict_note(marked)


def test_a_rollback_without_its_target_fails_at_start_naming_the_key() -> None:
    """``deployments`` needs an environment and ``webhook`` an http(s) URL; ``off`` builds no hook."""
    with pytest.raises(ValueError, match="rollback_environment"):
        GitLabConfig(url="http://gitlab", rollback="deployments")
    with pytest.raises(ValueError, match="rollback_webhook_url"):
        GitLabConfig(url="http://gitlab", rollback="webhook", rollback_webhook_url="ftp://x")
    assert rollback_hook(GitLabConfig(url="http://gitlab")) is None
