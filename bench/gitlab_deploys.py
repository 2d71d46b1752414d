"""Deployments, jobs, tags and releases for the local GitLab server (:mod:`bench.gitlab_server`): verdicts act on them.

The endpoints (under ``/api/v4/projects/:id``), shaped as GitLab answers them:

- ``GET /deployments`` with ``environment``, ``status``, ``order_by`` (``id``, ``iid``, ``created_at``...) and
  ``sort``; each deployment carries ``sha``, ``ref``, ``status``, ``environment`` and its ``deployable`` job;
- ``POST /jobs/:job_id/retry``: a new job for the same ref and commit and, for a deploy job, a new deployment of
  that commit to the job's environment (how GitLab's environment "Rollback" re-deploys an earlier build);
- ``GET /repository/tags/:tag``;
- ``GET /releases/:tag``, ``POST /releases`` (for an existing tag), ``PUT /releases/:tag``.

Tests seed deployments and tags in-process (:func:`seed_deployment`, :func:`seed_tag`) and read the releases back
(:func:`releases`). Everything lives in the server's one JSON store, so ``--state`` keeps it across restarts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.gitlab_server import FakeGitLab

Json = dict[str, Any]
Reply = tuple[int, Any, dict[str, str]]
LIVE = ("created", "running", "success", "blocked")


class NotFound(Exception):
    """A 404 in GitLab's shape (the server turns ``HttpError`` into one; this module must not import it)."""


def _data(app: FakeGitLab) -> Json:
    d = app.store.data
    for key in ("deployments", "jobs", "tags", "releases"):
        d.setdefault(key, [])
    return d


def _now() -> str:
    from bench.gitlab_server import _now as now

    return now()


def _job(app: FakeGitLab, ref: str, sha: str, environment: str, name: str = "deploy") -> Json:
    job = {"id": app.store.next_id(), "name": name, "ref": ref, "sha": sha, "status": "success",
           "environment": environment, "created_at": _now(), "retried_from": None}  # fmt: skip
    _data(app)["jobs"].append(job)
    return job


def _deployment(app: FakeGitLab, job: Json, status: str) -> Json:
    deployments = _data(app)["deployments"]
    d = {"id": app.store.next_id(), "iid": len(deployments) + 1, "ref": job["ref"], "sha": job["sha"],
         "status": status, "created_at": _now(), "environment": job["environment"], "job": job["id"]}  # fmt: skip
    deployments.append(d)
    return d


def _deployment_json(app: FakeGitLab, d: Json) -> Json:
    job = next(j for j in _data(app)["jobs"] if j["id"] == d["job"])
    return {
        "id": d["id"], "iid": d["iid"], "ref": d["ref"], "sha": d["sha"], "status": d["status"],
        "created_at": d["created_at"], "updated_at": d["created_at"],
        "environment": {"id": 1, "name": d["environment"]},
        "deployable": {"id": job["id"], "name": job["name"], "ref": job["ref"], "status": job["status"],
                       "commit": {"id": job["sha"]}},
    }  # fmt: skip


def seed_deployment(app: FakeGitLab, environment: str, sha: str, *, ref: str = "main", status: str = "success") -> Json:
    """A deploy job of ``sha`` and its deployment to ``environment`` (the deployment's JSON)."""
    with app.store.lock:
        d = _deployment(app, _job(app, ref, sha, environment), status)
        app.store.save()
        return _deployment_json(app, d)


def deployments(app: FakeGitLab, environment: str) -> list[Json]:
    """The environment's deployments, newest first."""
    with app.store.lock:
        found = [_deployment_json(app, d) for d in _data(app)["deployments"] if d["environment"] == environment]
    return sorted(found, key=lambda d: -int(d["id"]))


def seed_tag(app: FakeGitLab, name: str, sha: str) -> None:
    with app.store.lock:
        _data(app)["tags"].append({"name": name, "target": sha, "commit": {"id": sha}, "message": ""})
        app.store.save()


def releases(app: FakeGitLab) -> list[Json]:
    with app.store.lock:
        return [dict(r) for r in _data(app)["releases"]]


def _list_deployments(app: FakeGitLab, query: dict[str, list[str]], base: str) -> Reply:
    def one(name: str) -> str:
        return query.get(name, [""])[-1]

    items = [d for d in _data(app)["deployments"]
             if (not one("environment") or d["environment"] == one("environment"))
             and (not one("status") or d["status"] == one("status"))]  # fmt: skip
    key = one("order_by") or "id"
    field = key if key in ("id", "iid", "created_at", "ref") else "id"
    items.sort(key=lambda d: d[field], reverse=one("sort") != "asc")
    page = [_deployment_json(app, d) for d in items]
    return app._page(page, query, base, "/deployments")


def _retry(app: FakeGitLab, job_id: str) -> Reply:
    old = next((j for j in _data(app)["jobs"] if str(j["id"]) == job_id), None)
    if old is None:
        raise NotFound("404 Job Not Found")
    job = _job(app, old["ref"], old["sha"], old["environment"], old["name"])
    job["retried_from"] = old["id"]
    if old["environment"]:
        _deployment(app, job, "running")  # GitLab starts the re-deployment; the runner finishes it later
    return 201, dict(job), {}


def _tag(app: FakeGitLab, tag: str) -> Reply:
    found = next((t for t in _data(app)["tags"] if t["name"] == tag), None)
    if found is None:
        raise NotFound("404 Tag Not Found")
    return 200, dict(found), {}


def _release(app: FakeGitLab, tag: str) -> Json:
    found: Json | None = next((r for r in _data(app)["releases"] if r["tag_name"] == tag), None)
    if found is None:
        raise NotFound("404 Not Found")
    return found


def _create_release(app: FakeGitLab, data: Json) -> Reply:
    tag = str(data.get("tag_name") or "")
    _tag(app, tag)  # (GitLab would create the tag from ``ref``; the sink only releases existing tags)
    if any(r["tag_name"] == tag for r in _data(app)["releases"]):
        return 409, {"message": "Release already exists"}, {}
    release = {"tag_name": tag, "name": str(data.get("name") or tag), "description": str(data.get("description") or ""),
               "created_at": _now()}  # fmt: skip
    _data(app)["releases"].append(release)
    return 201, dict(release), {}


def _update_release(app: FakeGitLab, tag: str, data: Json) -> Reply:
    release = _release(app, tag)
    for key in ("name", "description"):
        if key in data:
            release[key] = str(data[key])
    return 200, dict(release), {}


def routes(app: FakeGitLab) -> list[tuple[str, str, Callable[..., Reply]]]:
    """(method, path under the project, handler) of every endpoint above, for the server's route table."""

    def guard(fn: Callable[..., Reply]) -> Callable[..., Reply]:
        def handler(**kwargs: Any) -> Reply:
            try:
                return fn(**kwargs)
            except NotFound as exc:
                return 404, {"message": str(exc)}, {}

        return handler

    return [
        ("GET", "/deployments", guard(lambda *, query, base, **_: _list_deployments(app, query, base))),
        ("POST", r"/jobs/(?P<job_id>\d+)/retry", guard(lambda *, job_id, **_: _retry(app, job_id))),
        ("GET", "/repository/tags/(?P<tag>[^/]+)", guard(lambda *, tag, **_: _tag(app, tag))),
        ("GET", "/releases/(?P<tag>[^/]+)", guard(lambda *, tag, **_: (200, dict(_release(app, tag)), {}))),
        ("POST", "/releases", guard(lambda *, data, **_: _create_release(app, data))),
        ("PUT", "/releases/(?P<tag>[^/]+)", guard(lambda *, tag, data, **_: _update_release(app, tag, data))),
    ]


__all__ = ["deployments", "releases", "routes", "seed_deployment", "seed_tag"]
