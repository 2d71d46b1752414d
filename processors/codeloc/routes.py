"""Routes as frameworks write them and as spans record them, in one form: ``accounts/{}/withdraw``.

Flask writes ``/accounts/<int:id>``, FastAPI and Spring ``/accounts/{id}``, Django ``accounts/<int:pk>/`` (and
``^accounts/(?P<pk>[0-9]+)/$`` with ``re_path``); the instrumentations record that template as ``http.route``.
A parameter becomes ``{}`` and slashes at either end go, so the same route compares equal however it was written.
"""

from __future__ import annotations

import re
from typing import Final

_GROUP: Final = re.compile(r"\(\?P<\w+>[^)]*\)")
_ANGLE: Final = re.compile(r"<[^<>/]*>")
_BRACE: Final = re.compile(r"\{[^{}/]*\}")
HTTP_METHODS: Final = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})


def normalise_route(path: str) -> str:
    """The route's comparable form (see the module docstring)."""
    for _ in range(len(path) + 2):  # to a fixed point, so the form of a form is itself (``^ ^x`` as ``x``)
        text = path.strip().removeprefix("^").removesuffix("$")
        text = _BRACE.sub("{}", _ANGLE.sub("{}", _GROUP.sub("{}", text)))
        text = "/".join(part.strip() for part in text.split("/") if part.strip())
        if text == path:
            break
        path = text
    return path


def join_route(prefix: str, path: str) -> str:
    return normalise_route(prefix.rstrip("/") + "/" + path.lstrip("/"))


def request_of(route: str, name: str) -> tuple[str, str]:
    """(method, route) of a server span: ``http.route`` and the method its name starts with (``GET /a/{id}``, the
    span name the HTTP conventions prescribe); the route from the name when ``http.route`` is missing."""
    head, _, rest = name.partition(" ")
    method = head.upper() if head.upper() in HTTP_METHODS else ""
    if not route and method and rest.strip():
        route = rest.strip()
    return method, normalise_route(route)
