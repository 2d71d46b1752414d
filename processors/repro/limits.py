"""Limits of a repro run that its configuration defaults to (no imports: ``[repro]``'s section reads them)."""

STATEMENT_TIMEOUT_MS = 5000  # statement_timeout and lock_timeout of a repro's recorded SQL; ``[repro]``'s default
