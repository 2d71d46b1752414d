"""structlog set-up: JSON lines when stderr is not a terminal, a readable console otherwise.

``level`` (the ``log_level`` setting, ``TRACE_REPRO_LOG_LEVEL``, ``trace-repro run --log-level``) filters the daemon's
lines when they are made (structlog's filtering bound logger: a filtered call costs a method lookup); library lines
(aiokafka) pass at WARNING and above, or at ``level`` when it is stricter.
"""

from __future__ import annotations

import logging
import sys

import structlog


def configure(level: str = "INFO") -> None:
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if sys.stderr.isatty() else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[*processors, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        # One write per line (PrintLogger writes the newline apart): worker processes share the daemon's stderr, and
        # their lines must not interleave.
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # Library loggers (aiokafka) go through the standard library at WARNING and above.
    library = max(logging.WARNING, logging.getLevelNamesMapping()[level])
    logging.basicConfig(level=library, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
