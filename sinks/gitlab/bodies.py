"""The GitLab bodies this package ships, registered on import: incidents and regressions by their kind, and the
generic body of every other finding (``*``). A detector may register its own for its type (see
:mod:`sinks.gitlab.body`)."""

from __future__ import annotations

from processors.model.finding import register_renderer
from sinks.gitlab.body import SURFACE
from sinks.gitlab.body_finding import FindingIssue
from sinks.gitlab.body_incident import IncidentIssue
from sinks.gitlab.body_regression import RegressionIssue

register_renderer(SURFACE, "incident", IncidentIssue)
register_renderer(SURFACE, "regression", RegressionIssue)
register_renderer(SURFACE, "*", FindingIssue)

__all__ = ["FindingIssue", "IncidentIssue", "RegressionIssue"]
