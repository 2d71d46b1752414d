"""The GitLab bodies this package ships, registered on import: incidents and regressions by their kind, and the
generic body of every other finding (``*``). A detector may register its own for its type (see
:mod:`sinks.gitlab.body`)."""

from __future__ import annotations

from processors.model.finding import register_renderer
from sinks.gitlab import body_finding, body_incident, body_regression
from sinks.gitlab.body import SURFACE, of_module

register_renderer(SURFACE, "incident", of_module(body_incident))
register_renderer(SURFACE, "regression", of_module(body_regression))
register_renderer(SURFACE, "*", of_module(body_finding))
