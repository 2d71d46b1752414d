"""The fake GitLab server: auth, 404s, iids, filters, pagination, uploads, persistence, faults and its CLI."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import gitlab
import pytest
import requests

from bench.gitlab_server import FakeGitLab
from tests.gitlab.helpers import PROJECT, TOKEN

H = {"PRIVATE-TOKEN": TOKEN}


def api(server: FakeGitLab, path: str) -> str:
    return f"{server.url}/api/v4/projects/1{path}"


def client(server: FakeGitLab) -> gitlab.Gitlab:
    return gitlab.Gitlab(server.url, private_token=TOKEN, timeout=5)


def test_auth_is_required(server: FakeGitLab) -> None:
    """No token or a wrong one is a 401 with GitLab's message; the right one is served."""
    assert requests.get(api(server, ""), timeout=5).status_code == 401
    wrong = requests.get(api(server, ""), headers={"PRIVATE-TOKEN": "nope"}, timeout=5)
    assert wrong.status_code == 401 and wrong.json() == {"message": "401 Unauthorized"}
    ok = requests.get(f"{server.url}/api/v4/projects/{PROJECT.replace('/', '%2F')}", headers=H, timeout=5)
    assert ok.status_code == 200 and ok.json()["path_with_namespace"] == PROJECT


def test_unknown_things_are_404s(server: FakeGitLab) -> None:
    """Unknown project, issue, branch, file and route answer 404 with a message."""
    for url in (
        f"{server.url}/api/v4/projects/other%2Fproject",
        api(server, "/issues/7"),
        api(server, "/repository/branches/nope"),
        api(server, "/repository/files/x.py/raw?ref=main"),
        api(server, "/pipelines"),
    ):
        r = requests.get(url, headers=H, timeout=5)
        assert r.status_code == 404 and "message" in r.json(), url


def test_python_gitlab_round_trip_with_iids_filters_and_pagination(server: FakeGitLab) -> None:
    """Issues created through python-gitlab get per-project iids; labels/state/search filter; pages link on."""
    project = client(server).projects.get(PROJECT)
    for n in range(25):
        project.issues.create(
            {
                "title": f"issue {n}",
                "description": "needle" if n == 3 else "hay",
                "labels": ["a", "b"] if n % 2 else ["a"],
            }
        )
    assert sorted(i.iid for i in project.issues.list(get_all=True)) == list(range(1, 26))
    assert len(project.issues.list(labels=["a", "b"], get_all=True)) == 12
    assert [i.iid for i in project.issues.list(search="needle", get_all=True)] == [4]
    project.issues.update(1, {"state_event": "close"})
    assert [i.iid for i in project.issues.list(state="closed", get_all=True)] == [1]
    assert len(project.issues.list(state="opened", get_all=True)) == 24
    r = requests.get(api(server, "/issues?per_page=10&page=2&labels=a"), headers=H, timeout=5)
    assert r.headers["X-Total"] == "25" and r.headers["X-Page"] == "2" and r.headers["X-Next-Page"] == "3"
    assert r.headers["X-Total-Pages"] == "3" and 'rel="next"' in r.headers["Link"] and len(r.json()) == 10
    last = requests.get(api(server, "/issues?per_page=10&page=3"), headers=H, timeout=5)
    assert last.headers["X-Next-Page"] == "" and 'rel="next"' not in last.headers["Link"] and len(last.json()) == 5
    issue = project.issues.get(1)
    assert issue.state == "closed" and issue.web_url == f"{server.url}/{PROJECT}/-/issues/1"
    assert [n["body"] for n in server.notes(1, system=True)] == ["closed"]


def test_notes_uploads_branches_commits_and_merge_requests(server: FakeGitLab) -> None:
    """The rest of the sink's endpoints behave like GitLab's where the sink depends on it."""
    project = client(server).projects.get(PROJECT)
    project.issues.create({"title": "t"})
    issue = project.issues.get(1, lazy=True)
    issue.notes.create({"body": "hello"})
    assert [n.body for n in issue.notes.list(get_all=True)] == ["hello"]
    upload = project.upload("x.txt", filedata=b"content")
    assert upload["markdown"].startswith("[x.txt](/uploads/")
    assert requests.get(f"{server.url}/{PROJECT}{upload['url']}", timeout=5).content == b"content"
    project.branches.create({"branch": "feature/x", "ref": "main"})
    with pytest.raises(gitlab.exceptions.GitlabCreateError):
        project.branches.create({"branch": "feature/x", "ref": "main"})
    project.commits.create(
        {
            "branch": "feature/x",
            "commit_message": "m",
            "actions": [{"action": "create", "file_path": "a/b.py", "content": "x = 1\n"}],
        }
    )
    assert project.files.raw(file_path="a/b.py", ref="feature/x") == b"x = 1\n"
    mr = project.mergerequests.create({"source_branch": "feature/x", "target_branch": "main", "title": "t"})
    assert mr.iid == 1 and mr.state == "opened"
    with pytest.raises(gitlab.exceptions.GitlabCreateError) as info:
        project.mergerequests.create({"source_branch": "feature/x", "target_branch": "main", "title": "again"})
    assert info.value.response_code == 409
    assert [m.iid for m in project.mergerequests.list(source_branch="feature/x", state="opened", get_all=True)] == [1]


def test_state_persists_across_restarts(tmp_path: Path) -> None:
    """With a state file, issues and notes survive a restart and iids continue."""
    state = tmp_path / "gitlab.json"
    with FakeGitLab(token=TOKEN, state_path=state) as first:
        client(first).projects.get(PROJECT).issues.create({"title": "kept", "description": "body"})
    with FakeGitLab(token=TOKEN, state_path=state) as second:
        project = client(second).projects.get(PROJECT)
        assert [i.title for i in project.issues.list(get_all=True)] == ["kept"]
        assert project.issues.create({"title": "next"}).iid == 2


def test_faults_over_http_and_in_process(server: FakeGitLab) -> None:
    """POST /__faults arms a fault like inject(): 500 once, then served; drops and hangs fail the client."""
    r = requests.post(f"{server.url}/__faults", json={"kind": "error", "path": "/issues$", "method": "GET"}, timeout=5)
    assert r.status_code == 201
    assert requests.get(api(server, "/issues"), headers=H, timeout=5).status_code == 500
    assert requests.get(api(server, "/issues"), headers=H, timeout=5).status_code == 200
    server.inject("/issues$", "rate_limit", retry_after=12)
    limited = requests.get(api(server, "/issues"), headers=H, timeout=5)
    assert limited.status_code == 429 and limited.headers["Retry-After"] == "12"
    server.inject("/issues$", "drop")
    with pytest.raises(requests.ConnectionError):
        requests.get(api(server, "/issues"), headers=H, timeout=5)
    server.inject("/issues$", "hang", hang_s=0.5)
    with pytest.raises(requests.Timeout):
        requests.get(api(server, "/issues"), headers=H, timeout=0.1)
    server.inject("/issues$", "error", method="POST", apply=True)
    assert requests.post(api(server, "/issues"), json={"title": "t"}, headers=H, timeout=5).status_code == 500
    assert [i["title"] for i in server.issues()] == ["t"]  # applied, although the answer was an error
    requests.post(f"{server.url}/__faults", json={"kind": "error", "path": "."}, timeout=5)
    assert requests.delete(f"{server.url}/__faults", timeout=5).status_code == 204
    assert requests.get(api(server, "/issues"), headers=H, timeout=5).status_code == 200


def test_verbose_prints_issue_url_and_body() -> None:
    """--verbose prints each created issue's URL and body."""
    out = io.StringIO()
    with FakeGitLab(verbose=True, out=out) as srv:
        requests.post(
            f"{srv.url}/api/v4/projects/1/issues", json={"title": "T", "description": "the body"}, headers=H, timeout=5
        )
    text = out.getvalue()
    assert f"issue #1 created: {srv.url}/trace-repro/shop/-/issues/1" in text and "the body" in text


def test_cli_serves_until_terminated(tmp_path: Path) -> None:
    """``python -m bench.gitlab_server --port 0 --state FILE`` prints its URL, serves, and saves its state."""
    state = tmp_path / "s.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.gitlab_server", "--port", "0", "--state", str(state)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split()[3]
        r = requests.post(f"{url}/api/v4/projects/1/issues", json={"title": "cli"}, headers=H, timeout=5)
        assert r.status_code == 201
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert [i["title"] for i in json.loads(state.read_text())["issues"]] == ["cli"]
