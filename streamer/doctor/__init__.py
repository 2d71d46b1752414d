"""``trace-repro doctor``: what the telemetry on the configured topics lacks for each capability, and what to turn on.

A bounded sample of the spans, logs and CDC topics (``sample``) is decoded with the daemon's own decoders and the
SQL access extractor; the spans are summed up per service (``services``), the row changes per table (``tables``),
and what the OTLP wire carries beside the decoded fields (SDK language, instrumentation scopes, sampling) is read
from the raw messages (``wire``). Each capability then gets a finding per service or table: ok, partial or missing,
with the one-line fix for the service's language (``fixes``); ``report`` renders them as a table or as JSON.
"""

from streamer.doctor.report import Finding, Report, Status

__all__ = ["Finding", "Report", "Status"]
