"""How a finding renders as a GitLab issue: the :class:`IssueBody` a finding's type or kind registered, found by lookup.

The sink knows no finding class. A renderer is registered with
:func:`~processors.model.finding.register_renderer` on the ``gitlab_body`` surface, keyed by a finding type
(``n_plus_one``), a published kind (``incident``, ``regression``: every type of that kind) or ``*`` (the generic
body of :mod:`sinks.gitlab.body_finding`, for every type without one of its own); :func:`issue_body` looks the
finding's type up first, then its kind, then ``*``. A renderer is a callable of the finding that returns an
:class:`IssueBody`; :func:`of_module` makes one of a module whose functions of the finding are the body's methods
(the bodies of this package, registered when :mod:`sinks.gitlab.bodies` is imported: the issues module does).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

from processors.model.finding import Finding, renderer_for
from sinks.gitlab.links import Links
from sinks.gitlab.state import IssueState

SURFACE = "gitlab_body"


class IssueBody(Protocol):
    """One finding's issue: its title, description and notes (pure functions of the finding, golden-tested)."""

    def anomaly(self) -> str:
        """The class its issue is labelled with (``anomaly::<class>``): an anomaly or a finding type."""
        ...

    def title(self) -> str: ...

    def description(self, state: IssueState | None = None, links: Links | None = None) -> str:
        """The description of the issue this finding files (or, better evidenced, now shows)."""
        ...

    def occurrence_note(self, number: int, *, last: bool, links: Links | None = None) -> str: ...

    def reopen_note(self, fixed_after_ms: float | None) -> str: ...

    def upgrade_note(self) -> str:
        """The note saying the description now shows this better-evidenced occurrence."""
        ...


@dataclass(frozen=True, slots=True)
class ModuleBody:
    """The :class:`IssueBody` of a body module: its functions ``anomaly(e)``, ``title(e)``,
    ``description(e, state, links)``, ``occurrence_note(e, number, last=, links=)``, ``reopen_note(e, fixed_after_ms)``
    and ``upgrade_note(e)``, applied to one finding."""

    module: ModuleType
    e: Any

    def anomaly(self) -> str:
        return str(self.module.anomaly(self.e))

    def title(self) -> str:
        return str(self.module.title(self.e))

    def description(self, state: IssueState | None = None, links: Links | None = None) -> str:
        return str(self.module.description(self.e, state, links))

    def occurrence_note(self, number: int, *, last: bool, links: Links | None = None) -> str:
        return str(self.module.occurrence_note(self.e, number, last=last, links=links))

    def reopen_note(self, fixed_after_ms: float | None) -> str:
        return str(self.module.reopen_note(self.e, fixed_after_ms))

    def upgrade_note(self) -> str:
        return str(self.module.upgrade_note(self.e))


def of_module(module: ModuleType) -> Callable[[Any], IssueBody]:
    """The renderer of a body module (see :class:`ModuleBody`)."""
    return functools.partial(ModuleBody, module)


class NoRenderer(LookupError):
    """No GitLab body is registered for a finding (not even the generic one: :mod:`sinks.gitlab.bodies` not loaded)."""


def issue_body(e: Finding) -> IssueBody:
    """The body ``e`` renders with: its type's, else its kind's, else the generic one."""
    found = renderer_for(SURFACE, e)
    if found is None:
        raise NoRenderer(f"no {SURFACE} renderer for {e.finding_type()!r}")
    body: IssueBody = found(e)
    return body


__all__ = ["SURFACE", "IssueBody", "ModuleBody", "NoRenderer", "issue_body", "of_module"]
