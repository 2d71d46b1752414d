"""A small GitLab-compatible REST server: the GitLab sink's tests, and ``make demo`` when no GitLab URL is set.

It implements exactly the ``/api/v4`` endpoints the sink uses, shaped the way python-gitlab expects them: the
project; issues (list with ``labels``/``state``/``search``/``iids[]`` filters and GitLab's pagination headers
``X-Total``, ``X-Page``, ``X-Next-Page`` and ``Link``; create; get; update with ``state_event``, ``description``,
``labels``, ``add_labels``, ``remove_labels``); labels (list, create, delete); issue notes; uploads (multipart);
branches; repository files (raw); commits with ``actions``; merge requests. Issue and merge-request iids count per
project; every request needs a ``PRIVATE-TOKEN`` header (401 without it, or with a wrong one when the server was
given a token); unknown things are 404s with GitLab's ``{"message": ...}`` bodies. Issues and uploads are also
served as plain pages (``/<project>/-/issues/<iid>``), so the URLs the sink prints open.

Fault injection, in-process (:meth:`FakeGitLab.inject`) or over HTTP (``POST /__faults`` with the same fields as
JSON; ``DELETE /__faults`` clears): the next ``count`` requests whose path matches the regex ``path`` (and
``method``, if given) get ``error`` (``status``: a 5xx by default, or a 4xx such as 403 or 422, with its reason
phrase), ``rate_limit`` (429 with ``Retry-After``), ``hang`` (no answer for ``hang_s`` seconds, then the
connection closes: past any client timeout), ``drop`` (the socket closes without a response) or ``barrier`` (held
until ``parties`` matching requests have arrived, then served: forces races). With ``apply=True`` the request is
carried out first and only its response fails, as when a write reached GitLab but the answer was lost. Assigning
``token`` switches the token the server accepts (an expired or rotated token).

``python -m bench.gitlab_server --port N --state FILE [--verbose]`` runs it in the foreground; ``--state`` keeps
everything in a JSON file across restarts, ``--verbose`` prints each created issue's URL and body.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import difflib
import email.parser
import email.policy
import hashlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from bench.gitlab_deploys import routes as deploy_routes

API = "/api/v4"
USER = {"id": 1, "username": "trace-repro-bot", "name": "trace-repro", "state": "active", "avatar_url": None}
FAULT_KINDS = ("error", "rate_limit", "hang", "drop", "barrier")
# GitLab's default issue closing pattern, simplified: a closing word, then #N (an issue of this project).
CLOSES = re.compile(r"\b(?:clos(?:e|es|ed|ing)|fix(?:es|ed|ing)?|resolv(?:e|es|ed|ing)|implement(?:s|ed|ing)?)\b:?"
                    r"\s+#(\d+)\b", re.IGNORECASE)  # fmt: skip

Json = dict[str, Any]
Reply = tuple[int, Any, dict[str, str]]


class HttpError(Exception):
    """An error answer in GitLab's shape."""

    def __init__(self, status: int, message: Any) -> None:
        super().__init__(str(message))
        self.status = status
        self.message = message


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _sha(*parts: object) -> str:
    return hashlib.sha1("|".join(str(p) for p in parts).encode()).hexdigest()


def _labels(value: Any) -> list[str]:
    if value is None:
        return []
    items = value if isinstance(value, list) else str(value).split(",")
    return [str(x).strip() for x in items if str(x).strip()]


@dataclass
class Fault:
    """One armed fault; see the module docstring."""

    kind: str
    path: str
    method: str | None = None
    count: int = 1
    status: int = 500
    retry_after: float | str | None = None  # a number (formatted with %g) or the header's text as it is
    apply: bool = False
    hang_s: float = 5.0
    parties: int = 2
    hits: int = 0
    barrier: threading.Barrier | None = field(default=None, repr=False)

    def matches(self, method: str, path: str) -> bool:
        return (
            self.hits < self.count
            and (self.method is None or self.method.upper() == method)
            and re.search(self.path, path) is not None
        )


class Store:
    """Everything the server knows, as one JSON-serialisable dict, behind one lock."""

    def __init__(self, project: str, state_path: Path | None) -> None:
        self.lock = threading.RLock()
        self.state_path = state_path
        if state_path is not None and state_path.exists():
            self.data: Json = json.loads(state_path.read_text())
        else:
            root = _sha("root", project)
            self.data = {
                "next_id": 100,
                "project": {"id": 1, "path_with_namespace": project, "default_branch": "main"},
                "issues": [],
                "notes": [],
                "labels": [],
                "uploads": [],
                "branches": {"main": {"commit": root, "files": {}}},
                "commits": [{"id": root, "message": "Initial commit", "branch": "main", "parent_ids": []}],
                "merge_requests": [],
            }

    def next_id(self) -> int:
        self.data["next_id"] += 1
        return int(self.data["next_id"])

    def save(self) -> None:
        if self.state_path is None:
            return
        tmp = self.state_path.with_suffix(self.state_path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True))
        os.replace(tmp, self.state_path)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    app: FakeGitLab


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    timeout = 60

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no 40 ms delayed-ACK stalls
        self.server.app._connections.add(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.app._connections.discard(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.app.verbose:
            self.server.app.say(f"[gitlab] {self.address_string()} {format % args}")

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        app = self.server.app
        split = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        base = f"http://{self.headers.get('Host') or app.host_port}"
        if split.path.startswith("/__faults"):
            self._send(*app.control(method, raw))
            return
        app.record(method, split.path)
        fault = app.take_fault(method, split.path)
        if fault is not None and fault.kind == "barrier":
            app.wait_barrier(fault)
            fault = None
        if fault is not None and not fault.apply:
            self._fail(fault)
            return
        reply = app.handle(method, split.path, parse_qs(split.query), raw, self.headers, base)
        if fault is not None:
            self._fail(fault)
            return
        self._send(*reply)

    def _send(self, status: int, payload: Any, headers: dict[str, str]) -> None:
        if isinstance(payload, bytes):
            data = payload
            headers = {"Content-Type": "application/octet-stream", **headers}
        else:
            data = json.dumps(payload).encode()
            headers = {"Content-Type": "application/json", **headers}
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _fail(self, fault: Fault) -> None:
        if fault.kind == "error":
            try:
                reason = HTTPStatus(fault.status).phrase
            except ValueError:
                reason = "Error"
            self._send(fault.status, {"message": f"{fault.status} {reason}"}, {})
        elif fault.kind == "rate_limit":
            after = fault.retry_after
            headers = {} if after is None else {"Retry-After": after if isinstance(after, str) else f"{after:g}"}
            self._send(429, {"message": "429 Too Many Requests"}, headers)
        else:
            if fault.kind == "hang":
                self.server.app.stopping.wait(fault.hang_s)
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)


class FakeGitLab:
    """The server and its in-process control API (start it in a thread with :meth:`start`)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        project: str = "trace-repro/shop",
        token: str | None = None,
        state_path: Path | None = None,
        verbose: bool = False,
        out: TextIO | None = None,
    ) -> None:
        self.store = Store(project, state_path)
        self.token = token
        self.verbose = verbose
        self.out = out or sys.stdout
        self.stopping = threading.Event()
        self.faults: list[Fault] = []
        self.requests: list[tuple[str, str]] = []
        self._connections: set[socket.socket] = set()
        self._httpd = _Server((host, port), _Handler)
        self._httpd.app = self
        self._thread: threading.Thread | None = None
        self._routes: list[tuple[str, re.Pattern[str], Callable[..., Reply]]] = [
            (m, re.compile(f"^{API}/projects/(?P<pid>[^/]+){p}$"), fn)
            for m, p, fn in (
                ("GET", "", self._project),
                ("GET", "/issues", self._list_issues),
                ("POST", "/issues", self._create_issue),
                ("GET", r"/issues/(?P<iid>\d+)", self._get_issue),
                ("PUT", r"/issues/(?P<iid>\d+)", self._update_issue),
                ("GET", r"/issues/(?P<iid>\d+)/notes", self._list_notes),
                ("POST", r"/issues/(?P<iid>\d+)/notes", self._create_note),
                ("GET", "/labels", self._list_labels),
                ("POST", "/labels", self._create_label),
                ("DELETE", "/labels/(?P<name>[^/]+)", self._delete_label),
                ("POST", "/uploads", self._upload),
                ("GET", "/repository/branches", self._list_branches),
                ("GET", "/repository/branches/(?P<branch>[^/]+)", self._get_branch),
                ("POST", "/repository/branches", self._create_branch),
                ("GET", "/repository/files/(?P<file>[^/]+)/raw", self._raw_file),
                ("POST", "/repository/commits", self._create_commit),
                ("GET", "/merge_requests", self._list_mrs),
                ("POST", "/merge_requests", self._create_mr),
                ("GET", r"/merge_requests/(?P<iid>\d+)", self._get_mr),
                ("GET", r"/merge_requests/(?P<iid>\d+)/diffs", self._mr_diffs),
                ("GET", r"/merge_requests/(?P<iid>\d+)/commits", self._mr_commits),
                ("PUT", r"/merge_requests/(?P<iid>\d+)/merge", self._merge_mr),
            )
        ]
        # What verdicts act on (issue 35): deployments, job retry, tags, releases (bench.gitlab_deploys).
        self._routes += [(m, re.compile(f"^{API}/projects/(?P<pid>[^/]+){p}$"), fn) for m, p, fn in deploy_routes(self)]

    # ---- lifecycle --------------------------------------------------------------------------------------------

    @property
    def host_port(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"{host!s}:{port}"

    @property
    def url(self) -> str:
        return f"http://{self.host_port}"

    @property
    def project_path(self) -> str:
        return str(self.store.data["project"]["path_with_namespace"])

    def start(self) -> FakeGitLab:
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="fake-gitlab", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._httpd.serve_forever()

    def stop(self) -> None:
        self.stopping.set()
        for f in self.faults:
            if f.barrier is not None:
                f.barrier.abort()
        self._httpd.shutdown()
        for conn in list(self._connections):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeGitLab:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    # ---- faults -----------------------------------------------------------------------------------------------

    def inject(
        self,
        path: str,
        kind: str = "error",
        *,
        method: str | None = None,
        count: int = 1,
        status: int = 500,
        retry_after: float | str | None = None,
        apply: bool = False,
        hang_s: float = 5.0,
        parties: int = 2,
    ) -> Fault:
        """Arm a fault for the next ``count`` requests whose path matches the regex ``path``."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}")
        fault = Fault(kind, path, method, count, status, retry_after, apply, hang_s, parties)
        if kind == "barrier":
            fault.count = parties
            fault.barrier = threading.Barrier(parties, timeout=10)
        with self.store.lock:
            self.faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self.store.lock:
            self.faults.clear()

    def take_fault(self, method: str, path: str) -> Fault | None:
        with self.store.lock:
            for f in self.faults:
                if f.matches(method, path):
                    f.hits += 1
                    return f
        return None

    def wait_barrier(self, fault: Fault) -> None:
        assert fault.barrier is not None
        with contextlib.suppress(threading.BrokenBarrierError):  # timed out or stopping: serve anyway
            fault.barrier.wait()

    def control(self, method: str, raw: bytes) -> Reply:
        if method == "DELETE":
            self.clear_faults()
            return 204, b"", {}
        if method == "POST":
            spec = json.loads(raw or b"{}")
            try:
                fault = self.inject(**{k: v for k, v in spec.items() if k in Fault.__dataclass_fields__})
            except (TypeError, ValueError) as exc:
                return 400, {"message": str(exc)}, {}
            return 201, {"kind": fault.kind, "path": fault.path, "count": fault.count}, {}
        with self.store.lock:
            return 200, [{"kind": f.kind, "path": f.path, "hits": f.hits, "count": f.count} for f in self.faults], {}

    def record(self, method: str, path: str) -> None:
        with self.store.lock:
            self.requests.append((method, path))

    # ---- in-process inspection --------------------------------------------------------------------------------

    def issues(self, label: str | None = None, *, tag: str | None = None) -> list[Json]:
        """The issues (with ``label``; whose description holds the text ``tag``), in creation order."""
        with self.store.lock:
            return [
                self._issue_json(i, self.url)
                for i in self.store.data["issues"]
                if (label is None or label in i["labels"]) and (tag is None or tag in (i["description"] or ""))
            ]

    def notes(self, iid: int, *, system: bool = False) -> list[Json]:
        with self.store.lock:
            return [
                dict(n) for n in self.store.data["notes"] if n["noteable_iid"] == iid and (system or not n["system"])
            ]

    def merge_requests(self) -> list[Json]:
        with self.store.lock:
            return [self._mr_json(m, self.url) for m in self.store.data["merge_requests"]]

    def file(self, path: str, ref: str = "main") -> str | None:
        with self.store.lock:
            branch = self.store.data["branches"].get(ref)
            return None if branch is None else branch["files"].get(path)

    def seed_file(self, path: str, content: str, branch: str = "main") -> None:
        with self.store.lock:
            self.store.data["branches"].setdefault(branch, {"commit": _sha(branch), "files": {}})["files"][path] = (
                content
            )
            self.store.save()

    def upload_content(self, url: str) -> bytes | None:
        with self.store.lock:
            for u in self.store.data["uploads"]:
                if url.endswith(f"/uploads/{u['secret']}/{u['filename']}"):
                    return base64.b64decode(u["content"])
        return None

    # ---- routing ----------------------------------------------------------------------------------------------

    def handle(self, method: str, path: str, query: dict[str, list[str]], raw: bytes, headers: Any, base: str) -> Reply:
        try:
            if not path.startswith(API + "/"):
                return self._web(method, path)
            if not self._authorised(headers):
                return 401, {"message": "401 Unauthorized"}, {}
            for m, pattern, fn in self._routes:
                match = pattern.match(path)
                if match and m == method:
                    args = {k: unquote(v) for k, v in match.groupdict().items()}
                    pid = args.pop("pid")
                    with self.store.lock:
                        self._check_project(pid)
                        data = self._body(raw, headers, query)
                        reply = fn(base=base, query=query, data=data, **args)
                        if method != "GET":
                            self.store.save()
                        return reply
            return 404, {"message": "404 Not Found"}, {}
        except HttpError as exc:
            return exc.status, {"message": exc.message}, {}
        except Exception as exc:  # a bug here must look like a GitLab 500, not a dropped connection
            print(f"[gitlab] internal error on {method} {path}: {exc!r}", file=sys.stderr)
            return 500, {"message": "500 Internal Server Error"}, {}

    def _authorised(self, headers: Any) -> bool:
        token = headers.get("PRIVATE-TOKEN") or ""
        bearer = headers.get("Authorization") or ""
        if bearer.startswith("Bearer "):
            token = token or bearer[7:]
        if not token:
            return False
        return self.token is None or secrets.compare_digest(token, self.token)

    def _check_project(self, pid: str) -> None:
        project = self.store.data["project"]
        if pid not in (str(project["id"]), project["path_with_namespace"]):
            raise HttpError(404, "404 Project Not Found")

    def _body(self, raw: bytes, headers: Any, query: dict[str, list[str]]) -> Json:
        data: Json = {k: v[-1] for k, v in query.items() if not k.endswith("[]")}
        ctype = str(headers.get("Content-Type") or "")
        if not raw:
            return data
        if ctype.startswith("application/json"):
            body = json.loads(raw)
            if isinstance(body, dict):
                data.update(body)
        elif ctype.startswith("multipart/form-data"):
            msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
                b"Content-Type: " + ctype.encode() + b"\r\n\r\n" + raw
            )
            for part in msg.iter_parts():
                name = part.get_param("name", header="content-disposition")
                payload = part.get_payload(decode=True)
                if name == "file":
                    data["file"] = (part.get_filename() or "file", payload)
                elif isinstance(name, str) and isinstance(payload, bytes):
                    data[name] = payload.decode()
        return data

    def _page(self, items: list[Json], query: dict[str, list[str]], base: str, path: str) -> Reply:
        def one(name: str, default: int) -> int:
            try:
                return max(1, int(query.get(name, [str(default)])[-1]))
            except ValueError:
                return default

        per_page = min(one("per_page", 20), 100)
        page = one("page", 1)
        total = len(items)
        pages = max(1, -(-total // per_page))
        chunk = items[(page - 1) * per_page : page * per_page]

        def link(n: int) -> str:
            params = {k: v for k, v in query.items() if k not in ("page", "per_page")}
            params.update({"page": [str(n)], "per_page": [str(per_page)]})
            return f"{base}{path}?{urlencode(params, doseq=True)}"

        headers = {
            "X-Total": str(total),
            "X-Total-Pages": str(pages),
            "X-Page": str(page),
            "X-Per-Page": str(per_page),
            "X-Next-Page": str(page + 1) if page < pages else "",
            "X-Prev-Page": str(page - 1) if page > 1 else "",
        }
        links = [f'<{link(page + 1)}>; rel="next"'] if page < pages else []
        links += [f'<{link(1)}>; rel="first"', f'<{link(pages)}>; rel="last"']
        headers["Link"] = ", ".join(links)
        return 200, chunk, headers

    @staticmethod
    def _sorted(items: list[Json], query: dict[str, list[str]]) -> list[Json]:
        order = query.get("sort", ["desc"])[-1]
        return sorted(items, key=lambda x: int(x["id"]), reverse=order != "asc")

    # ---- JSON shapes ------------------------------------------------------------------------------------------

    def _web(self, method: str, path: str) -> Reply:
        project = self.project_path
        m = re.match(rf"^/{re.escape(project)}/-/issues/(\d+)$", path)
        if method == "GET" and m:
            with self.store.lock:
                issue = self._issue(int(m.group(1)))
                notes = [n for n in self.store.data["notes"] if n["noteable_iid"] == issue["iid"]]
                text = f"# {issue['title']} (#{issue['iid']}, {issue['state']})\n\n{issue['description']}\n"
                for n in notes:
                    text += f"\n---\n{'system' if n['system'] else 'note'} {n['created_at']}\n\n{n['body']}\n"
            return 200, text.encode(), {"Content-Type": "text/markdown; charset=utf-8"}
        m = re.match(rf"^(?:/{re.escape(project)})?/uploads/([0-9a-f]+)/([^/]+)$", path)
        if method == "GET" and m:
            content = self.upload_content(f"/uploads/{m.group(1)}/{unquote(m.group(2))}")
            if content is not None:
                return 200, content, {"Content-Type": "text/plain; charset=utf-8"}
        return 404, {"message": "404 Not Found"}, {}

    def _issue_json(self, i: Json, base: str) -> Json:
        project = self.store.data["project"]
        notes = sum(1 for n in self.store.data["notes"] if n["noteable_iid"] == i["iid"] and not n["system"])
        return {
            **{k: v for k, v in i.items()},
            "project_id": project["id"],
            "type": "ISSUE",
            "author": USER,
            "assignees": [],
            "milestone": None,
            "confidential": bool(i.get("confidential", False)),
            "discussion_locked": None,
            "user_notes_count": notes,
            "web_url": f"{base}/{project['path_with_namespace']}/-/issues/{i['iid']}",
            "references": {
                "short": f"#{i['iid']}",
                "relative": f"#{i['iid']}",
                "full": f"{project['path_with_namespace']}#{i['iid']}",
            },
        }

    def _mr_json(self, m: Json, base: str) -> Json:
        project = self.store.data["project"]
        return {
            **{k: v for k, v in m.items() if k not in ("base_files", "merged_files")},  # the server's own
            "project_id": project["id"],
            "author": USER,
            "merge_status": "can_be_merged",
            "web_url": f"{base}/{project['path_with_namespace']}/-/merge_requests/{m['iid']}",
            "references": {"short": f"!{m['iid']}", "full": f"{project['path_with_namespace']}!{m['iid']}"},
        }

    def _issue(self, iid: int) -> Json:
        for i in self.store.data["issues"]:
            if i["iid"] == iid:
                return i  # type: ignore[no-any-return]
        raise HttpError(404, "404 Issue Not Found")

    def _ensure_label(self, name: str, color: str = "#6699cc", description: str = "") -> Json | None:
        if any(lb["name"] == name for lb in self.store.data["labels"]):
            return None
        label = {
            "id": self.store.next_id(),
            "name": name,
            "color": color,
            "description": description,
            "text_color": "#FFFFFF",
            "priority": None,
            "is_project_label": True,
        }
        self.store.data["labels"].append(label)
        return label

    # ---- endpoints --------------------------------------------------------------------------------------------

    def _project(self, *, base: str, **_: Any) -> Reply:
        p = self.store.data["project"]
        name = p["path_with_namespace"].rsplit("/", 1)[-1]
        return (
            200,
            {
                **p,
                "name": name,
                "path": name,
                "web_url": f"{base}/{p['path_with_namespace']}",
                "visibility": "private",
                "issues_enabled": True,
            },
            {},
        )

    def _list_issues(self, *, base: str, query: dict[str, list[str]], **_: Any) -> Reply:
        wanted = _labels(query.get("labels", [""])[-1])
        state = query.get("state", ["all"])[-1]
        search = query.get("search", [""])[-1].lower()
        iids = {int(x) for x in query.get("iids[]", []) if x.isdigit()}
        items = [
            i
            for i in self.store.data["issues"]
            if all(lb in i["labels"] for lb in wanted)
            and (state == "all" or i["state"] == state)
            and (not search or search in i["title"].lower() or search in (i["description"] or "").lower())
            and (not iids or i["iid"] in iids)
        ]
        status, chunk, headers = self._page(self._sorted(items, query), query, base, f"{API}/projects/1/issues")
        return status, [self._issue_json(i, base) for i in chunk], headers

    def _create_issue(self, *, base: str, data: Json, **_: Any) -> Reply:
        title = str(data.get("title") or "").strip()
        if not title:
            raise HttpError(400, "title is missing")
        issues = self.store.data["issues"]
        iid = max((i["iid"] for i in issues), default=0) + 1
        labels = _labels(data.get("labels"))
        for name in labels:
            self._ensure_label(name)
        now = _now()
        issue = {
            "id": self.store.next_id(),
            "iid": iid,
            "title": title[:255],
            "description": str(data.get("description") or ""),
            "state": "opened",
            "labels": labels,
            "created_at": now,
            "updated_at": now,
            "closed_at": None,
            "closed_by": None,
            "confidential": data.get("confidential") in (True, "true", "1", 1),  # as GitLab stores it
        }
        issues.append(issue)
        out = self._issue_json(issue, base)
        if self.verbose:
            self.say(f"[gitlab] issue #{iid} created: {out['web_url']}\n[gitlab]   {title}\n{issue['description']}")
        return 201, out, {}

    def _get_issue(self, *, base: str, iid: str, **_: Any) -> Reply:
        return 200, self._issue_json(self._issue(int(iid)), base), {}

    def _system_note(self, iid: int, text: str) -> None:
        self.store.data["notes"].append(
            {"id": self.store.next_id(), "body": text, "system": True, "noteable_iid": iid, "created_at": _now()}
        )

    def _update_issue(self, *, base: str, iid: str, data: Json, **_: Any) -> Reply:
        issue = self._issue(int(iid))
        for key in ("title", "description"):
            if key in data:
                issue[key] = str(data[key] or "")
        if "labels" in data:
            issue["labels"] = _labels(data["labels"])
        issue["labels"] = [lb for lb in issue["labels"] if lb not in _labels(data.get("remove_labels"))]
        issue["labels"] += [lb for lb in _labels(data.get("add_labels")) if lb not in issue["labels"]]
        for name in issue["labels"]:
            self._ensure_label(name)
        event = data.get("state_event")
        if event == "close" and issue["state"] != "closed":
            issue.update(state="closed", closed_at=_now(), closed_by=USER)
            self._system_note(issue["iid"], "closed")
        elif event == "reopen" and issue["state"] == "closed":
            issue.update(state="opened", closed_at=None, closed_by=None)
            self._system_note(issue["iid"], "reopened")
        elif event not in (None, "close", "reopen"):
            raise HttpError(400, "state_event does not have a valid value")
        issue["updated_at"] = _now()
        if self.verbose and event:
            self.say(f"[gitlab] issue #{issue['iid']} {event}: state {issue['state']}")
        return 200, self._issue_json(issue, base), {}

    def _list_notes(self, *, base: str, iid: str, query: dict[str, list[str]], **_: Any) -> Reply:
        issue = self._issue(int(iid))
        items = [n for n in self.store.data["notes"] if n["noteable_iid"] == issue["iid"]]
        path = f"{API}/projects/1/issues/{issue['iid']}/notes"
        status, chunk, headers = self._page(self._sorted(items, query), query, base, path)
        return status, [self._note_json(n, issue) for n in chunk], headers

    @staticmethod
    def _note_json(n: Json, issue: Json) -> Json:
        return {
            **n,
            "type": None,
            "attachment": None,
            "author": USER,
            "updated_at": n["created_at"],
            "noteable_id": issue["id"],
            "noteable_type": "Issue",
            "resolvable": False,
            "confidential": False,
            "internal": False,
        }

    def _create_note(self, *, iid: str, data: Json, **_: Any) -> Reply:
        issue = self._issue(int(iid))
        text = str(data.get("body") or "")
        if not text.strip():
            raise HttpError(400, {"note": ["can't be blank"]})
        note = {
            "id": self.store.next_id(),
            "body": text,
            "system": False,
            "noteable_iid": issue["iid"],
            "created_at": _now(),
        }
        self.store.data["notes"].append(note)
        if self.verbose:
            first = next((ln for ln in text.splitlines() if ln.strip() and not ln.startswith("<!--")), "")
            self.say(f"[gitlab] note on #{issue['iid']}: {first[:150]}")
        return 201, self._note_json(note, issue), {}

    def _list_labels(self, *, base: str, query: dict[str, list[str]], **_: Any) -> Reply:
        labels = sorted(self.store.data["labels"], key=lambda x: x["name"])
        return self._page(labels, query, base, f"{API}/projects/1/labels")

    def _create_label(self, *, data: Json, **_: Any) -> Reply:
        name = str(data.get("name") or "").strip()
        if not name or not data.get("color"):
            raise HttpError(400, "name and color are required")
        label = self._ensure_label(name, str(data["color"]), str(data.get("description") or ""))
        if label is None:
            raise HttpError(409, "Label already exists")
        return 201, label, {}

    def _delete_label(self, *, name: str, **_: Any) -> Reply:
        """As GitLab: the label is gone from the project and from every issue that had it."""
        name = unquote(name)
        labels = self.store.data["labels"]
        if not any(lb["name"] == name for lb in labels):
            raise HttpError(404, "404 Label Not Found")
        self.store.data["labels"] = [lb for lb in labels if lb["name"] != name]
        for issue in self.store.data["issues"]:
            issue["labels"] = [lb for lb in issue["labels"] if lb != name]
        return 204, b"", {}

    def labels(self) -> list[str]:
        """The names of the project's labels."""
        with self.store.lock:
            return sorted(lb["name"] for lb in self.store.data["labels"])

    def _upload(self, *, data: Json, **_: Any) -> Reply:
        item = data.get("file")
        if not isinstance(item, tuple):
            raise HttpError(400, "file is missing")
        filename = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(item[0])) or "file"
        secret = secrets.token_hex(16)
        url = f"/uploads/{secret}/{filename}"
        content = item[1] if isinstance(item[1], bytes) else b""
        self.store.data["uploads"].append(
            {
                "id": self.store.next_id(),
                "secret": secret,
                "filename": filename,
                "content": base64.b64encode(content).decode(),
            }
        )
        full = f"/{self.project_path}{url}"
        return (
            201,
            {
                "id": self.store.data["next_id"],
                "alt": filename,
                "url": url,
                "full_path": full,
                "markdown": f"[{filename}]({url})",
            },
            {},
        )

    def _branch_json(self, name: str, base: str) -> Json:
        branch = self.store.data["branches"][name]
        commit = next((c for c in self.store.data["commits"] if c["id"] == branch["commit"]), None) or {}
        default = name == self.store.data["project"]["default_branch"]
        return {
            "name": name,
            "merged": False,
            "protected": default,
            "default": default,
            "can_push": True,
            "developers_can_push": True,
            "developers_can_merge": True,
            "web_url": f"{base}/{self.project_path}/-/tree/{quote(name, safe='')}",
            "commit": {
                "id": branch["commit"],
                "short_id": branch["commit"][:8],
                "title": str(commit.get("message", "")).split("\n", 1)[0],
                "message": commit.get("message", ""),
            },
        }

    def _list_branches(self, *, base: str, query: dict[str, list[str]], **_: Any) -> Reply:
        names = sorted(self.store.data["branches"])
        return self._page([self._branch_json(n, base) for n in names], query, base, f"{API}/projects/1/branches")

    def _get_branch(self, *, base: str, branch: str, **_: Any) -> Reply:
        if branch not in self.store.data["branches"]:
            raise HttpError(404, "404 Branch Not Found")
        return 200, self._branch_json(branch, base), {}

    def _create_branch(self, *, base: str, data: Json, **_: Any) -> Reply:
        name, ref = str(data.get("branch") or ""), str(data.get("ref") or "")
        branches = self.store.data["branches"]
        if not name:
            raise HttpError(400, "branch is missing")
        if ref not in branches:
            raise HttpError(400, "Invalid reference name: " + ref)
        if name in branches:
            raise HttpError(400, "Branch already exists")
        branches[name] = {"commit": branches[ref]["commit"], "files": dict(branches[ref]["files"])}
        return 201, self._branch_json(name, base), {}

    def _raw_file(self, *, file: str, query: dict[str, list[str]], **_: Any) -> Reply:
        ref = query.get("ref", [self.store.data["project"]["default_branch"]])[-1]
        content = self.file(file, ref)
        if content is None:
            raise HttpError(404, "404 File Not Found")
        return 200, content.encode(), {"Content-Type": "text/plain; charset=utf-8"}

    def _create_commit(self, *, base: str, data: Json, **_: Any) -> Reply:
        branches = self.store.data["branches"]
        name = str(data.get("branch") or "")
        start = str(data.get("start_branch") or "")
        if name not in branches and start not in branches:
            raise HttpError(400, "You can only create or edit files when you are on a branch")
        message = str(data.get("commit_message") or "")
        if not message:
            raise HttpError(400, "commit_message is missing")
        source = branches.get(name) or branches[start]
        files = dict(source["files"])
        for action in data.get("actions") or []:
            path, kind = str(action.get("file_path") or ""), action.get("action")
            content = str(action.get("content") or "")
            if action.get("encoding") == "base64":
                content = base64.b64decode(content).decode()
            if kind == "create" and path in files:
                raise HttpError(400, "A file with this name already exists")
            if kind in ("update", "delete") and path not in files:
                raise HttpError(400, "A file with this name doesn't exist")
            if kind in ("create", "update"):
                files[path] = content
            elif kind == "delete":
                files.pop(path)
            else:
                raise HttpError(400, f"unsupported action {kind!r}")
        sha = _sha(source["commit"], message, json.dumps(files, sort_keys=True), self.store.next_id())
        branches[name] = {"commit": sha, "files": files}
        commit = {"id": sha, "message": message, "branch": name, "parent_ids": [source["commit"]]}
        self.store.data["commits"].append(commit)
        return (
            201,
            {
                **commit,
                "short_id": sha[:8],
                "title": message.split("\n", 1)[0],
                "created_at": _now(),
                "author_name": USER["name"],
                "web_url": f"{base}/{self.project_path}/-/commit/{sha}",
            },
            {},
        )

    def _list_mrs(self, *, base: str, query: dict[str, list[str]], **_: Any) -> Reply:
        state = query.get("state", ["all"])[-1]
        source = query.get("source_branch", [""])[-1]
        target = query.get("target_branch", [""])[-1]
        items = [
            m
            for m in self.store.data["merge_requests"]
            if (state == "all" or m["state"] == state)
            and (not source or m["source_branch"] == source)
            and (not target or m["target_branch"] == target)
        ]
        status, chunk, headers = self._page(self._sorted(items, query), query, base, f"{API}/projects/1/merge_requests")
        return status, [self._mr_json(m, base) for m in chunk], headers

    def _create_mr(self, *, base: str, data: Json, **_: Any) -> Reply:
        source, target = str(data.get("source_branch") or ""), str(data.get("target_branch") or "")
        title = str(data.get("title") or "")
        branches = self.store.data["branches"]
        if not title or source not in branches or target not in branches:
            raise HttpError(400, ["title, source_branch and target_branch must exist"])
        mrs = self.store.data["merge_requests"]
        for m in mrs:
            if m["state"] == "opened" and m["source_branch"] == source and m["target_branch"] == target:
                raise HttpError(409, [f"Another open merge request already exists for this source branch: !{m['iid']}"])
        mr = {
            "id": self.store.next_id(),
            "iid": max((m["iid"] for m in mrs), default=0) + 1,
            "title": title,
            "description": str(data.get("description") or ""),
            "state": "opened",
            "source_branch": source,
            "target_branch": target,
            "labels": _labels(data.get("labels")),
            "created_at": _now(),
            "sha": branches[source]["commit"],
            "base_files": dict(branches[target]["files"]),  # the target as the MR forked from it: its diff's base
            "base_commit": branches[target]["commit"],
        }
        mrs.append(mr)
        out = self._mr_json(mr, base)
        if self.verbose:
            self.say(f"[gitlab] merge request !{mr['iid']} created: {out['web_url']}\n{mr['description']}")
        return 201, out, {}

    # ---- merge requests: one, its diffs and commits, merging --------------------------------------------------

    def _mr(self, iid: int) -> Json:
        found: list[Json] = [m for m in self.store.data["merge_requests"] if m["iid"] == iid]
        if not found:
            raise HttpError(404, "404 Not found")
        return found[0]

    def _get_mr(self, *, base: str, iid: str, **_: Any) -> Reply:
        return 200, self._mr_json(self._mr(int(iid)), base), {}

    def _mr_diffs(self, *, base: str, iid: str, query: dict[str, list[str]], **_: Any) -> Reply:
        """GitLab's ``/diffs``: per changed file, its paths, new/deleted flags and the hunks (from ``@@``)."""
        m = self._mr(int(iid))
        old = m.get("base_files", {})
        new = self.store.data["branches"].get(m["source_branch"], {}).get("files", {}) if m["state"] != "merged" else (
            m.get("merged_files", {}))  # fmt: skip
        items = []
        for path in sorted(set(old) | set(new)):
            before, after = old.get(path), new.get(path)
            if before == after:
                continue
            hunks = difflib.unified_diff((before or "").splitlines(), (after or "").splitlines(), lineterm="", n=3)
            text = "\n".join(list(hunks)[2:]) + "\n"
            items.append({"old_path": path, "new_path": path, "diff": text, "new_file": before is None,
                          "renamed_file": False, "deleted_file": after is None})  # fmt: skip
        return self._page(items, query, base, f"{API}/projects/1/merge_requests/{m['iid']}/diffs")

    def _mr_commits(self, *, base: str, iid: str, query: dict[str, list[str]], **_: Any) -> Reply:
        """The MR's own commits (on its source branch since it forked), newest first, as GitLab lists them."""
        m = self._mr(int(iid))
        ids = [c["id"] for c in self.store.data["commits"] if c["branch"] == m["source_branch"]]
        commits = [c for c in self.store.data["commits"] if c["id"] in ids]
        items = [{**c, "short_id": c["id"][:8], "title": str(c["message"]).split("\n", 1)[0]} for c in commits[::-1]]
        return self._page(items, query, base, f"{API}/projects/1/merge_requests/{m['iid']}/commits")

    def _merge_mr(self, *, base: str, iid: str, **_: Any) -> Reply:
        """Merge: the target branch takes the source's files; merged into the default branch, the issues the
        description or a commit message closes (``Closes #N``, ``Fixes #N``, ...) are closed, as GitLab does."""
        m = self._mr(int(iid))
        if m["state"] != "opened":
            raise HttpError(405, "405 Method Not Allowed")
        branches = self.store.data["branches"]
        source = branches[m["source_branch"]]
        merged = _merge_files(m.get("base_files", {}), branches[m["target_branch"]]["files"], source["files"])
        if merged is None:
            raise HttpError(406, "Branch cannot be merged")  # GitLab's answer to a conflict
        sha = _sha(source["commit"], "merge", self.store.next_id())
        branches[m["target_branch"]] = {"commit": sha, "files": merged}
        messages = [c["message"] for c in self.store.data["commits"] if c["branch"] == m["source_branch"]]
        self.store.data["commits"].append({"id": sha, "message": f"Merge branch '{m['source_branch']}'",
                                           "branch": m["target_branch"], "parent_ids": [source["commit"]]})  # fmt: skip
        m.update(state="merged", merged_at=_now(), merge_commit_sha=sha, merged_files=dict(source["files"]))
        if m["target_branch"] == self.store.data["project"]["default_branch"]:
            for text in [m["description"], *messages]:
                for number in CLOSES.findall(text):
                    issue = next((i for i in self.store.data["issues"] if i["iid"] == int(number)), None)
                    if issue is not None and issue["state"] != "closed":
                        issue.update(state="closed", closed_at=_now(), closed_by=USER)
                        self._system_note(issue["iid"], f"closed via merge request !{m['iid']}")
        return 200, self._mr_json(m, base), {}


def _merge_files(base: dict[str, str], target: dict[str, str], source: dict[str, str]) -> dict[str, str] | None:
    """A three-way merge of whole trees: what the source changed since ``base`` goes onto ``target``; a file both
    changed is merged by lines (``git merge-file``); None on a conflict."""
    merged = dict(target)
    for path in set(base) | set(source):
        was, theirs, ours = base.get(path), source.get(path), target.get(path)
        if theirs in (was, ours):
            continue  # the source did not change it, or made the same change
        if ours == was:
            if theirs is None:
                merged.pop(path, None)
            else:
                merged[path] = theirs
            continue
        if None in (was, theirs, ours):
            return None  # added or deleted on both sides, differently
        with tempfile.TemporaryDirectory() as tmp:
            names = []
            for name, text in (("ours", ours), ("base", was), ("theirs", theirs)):
                (Path(tmp) / name).write_text(str(text))
                names.append(str(Path(tmp) / name))
            done = subprocess.run(["git", "merge-file", "-p", *names], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return None
        merged[path] = done.stdout
    return merged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gitlab_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--state", type=Path, default=None, help="JSON file that keeps the state across restarts")
    parser.add_argument("--project", default="trace-repro/shop", help="path_with_namespace of the one project")
    parser.add_argument(
        "--token",
        default=os.environ.get("FAKE_GITLAB_TOKEN"),
        help="accept only this token (default: any non-empty token)",
    )
    parser.add_argument("--verbose", action="store_true", help="print created issues' URLs and bodies")
    args = parser.parse_args(argv)
    server = FakeGitLab(
        args.host, args.port, project=args.project, token=args.token, state_path=args.state, verbose=args.verbose
    )
    server.say(f"fake GitLab at {server.url} (project {server.project_path}; API {server.url}{API})")

    def _stop(*_: object) -> None:
        threading.Thread(target=server.stop, daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stopping.set()
    return 0


if __name__ == "__main__":
    sys.exit(main())
