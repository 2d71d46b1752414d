"""Links in issues: a trace id to the team's trace UI, a code location to the file at the deployed commit.

Both are URL templates from ``[gitlab]``: ``trace_url`` with ``{trace_id}`` (Tempo
``https://tempo/trace/{trace_id}``, Jaeger ``https://jaeger/trace/{trace_id}``, a Grafana Explore URL), and
``source_url`` with ``{path}`` and optionally ``{ref}``, ``{line}``, ``{service}``
(``https://gitlab.example.com/shop/shop/-/blob/{ref}/{path}#L{line}``). The ref is ``source_ref`` when set, else the
span's ``service.version`` (a build that sets its version to its commit gets links at exactly that commit). A file
path from a span (``code.file.path``) is the build machine's: it is made relative to the first of ``source_roots``
it is under; a path still absolute, or one that climbs out (``..``), is shown but not linked (without a line number,
a ``#...{line}`` anchor is left out). Values from spans are percent-encoded into the URL and shown as code spans; a
trace id is linked only when it is hex, so nothing from a span can inject Markdown or change where a link points.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from urllib.parse import quote

from sinks.gitlab.escape import code

_TRACE_ID = re.compile(r"^[0-9a-f]{16,32}$")


@dataclass(frozen=True, slots=True)
class Links:
    """How issues link traces and files (empty templates: nothing is linked, everything is still shown)."""

    trace_url: str = ""
    source_url: str = ""
    source_ref: str = ""
    source_roots: tuple[str, ...] = ()

    def trace(self, trace_id: str, *, cell: bool = False) -> str:
        """The whole trace id as code, linked to the trace UI when one is configured."""
        shown = code(trace_id, cell=cell)
        if not self.trace_url or not _TRACE_ID.match(trace_id):
            return shown
        return f"[{shown}]({self.trace_url.replace('{trace_id}', trace_id)})"

    def relative(self, path: str) -> str:
        """``path`` relative to the first source root it is under (unchanged when under none)."""
        for root in self.source_roots:
            prefix = root.rstrip("/") + "/"
            if path.startswith(prefix):
                return path[len(prefix) :]
        return path

    def file(self, path: str, line: int = 0, *, version: str = "", service: str = "", cell: bool = False) -> str:
        """A code location as code (``path:line``, the path made relative), linked to the file at the ref."""
        rel = self.relative(path)
        shown = code(f"{rel}:{line}" if rel and line > 0 else rel, cell=cell)
        ref = self.source_ref or version
        clean = posixpath.normpath(rel) if rel else ""
        if (
            not self.source_url
            or not clean
            or clean.startswith(("/", ".."))
            or ("{ref}" in self.source_url and not ref)
        ):
            return shown
        template = self.source_url
        if line <= 0 and "{line}" in template:  # no line known: the file, without a line anchor
            template = template.split("#", 1)[0] if "{line}" in template.split("#", 1)[-1] else template
        url = (
            template.replace("{ref}", quote(ref, safe=""))
            .replace("{path}", quote(clean, safe="/"))
            .replace("{line}", str(max(line, 1)))
            .replace("{service}", quote(service, safe=""))
        )
        return f"[{shown}]({url})"


__all__ = ["Links"]
