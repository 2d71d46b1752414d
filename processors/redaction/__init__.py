"""Redaction: production values (row images, statement parameters) as they may leave the daemon.

``RedactionConfig`` is the ``[redaction]`` section, ``Policy`` decides per column and value, ``Redactor`` applies
it to a whole event; the runtime calls the redactor on every event before it is published (``streamer.runtime``).
"""

from processors.redaction.config import SENSITIVE, RedactionConfig
from processors.redaction.events import Redactor, redacted
from processors.redaction.policy import DROPPED, HASHED, Policy, RedactionKeyMissing, is_marker

__all__ = [
    "DROPPED",
    "HASHED",
    "SENSITIVE",
    "Policy",
    "RedactionConfig",
    "RedactionKeyMissing",
    "Redactor",
    "is_marker",
    "redacted",
]
