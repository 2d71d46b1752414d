"""What every issue, note and body module shares: the fingerprint label, note ids and markers, times, names.

An issue is found by the scoped label ``trace-repro::fp::<fingerprint>`` (:func:`fingerprint_label`). A note
starts with the hidden marker ``<!-- trace-repro:event:<id> -->`` (:func:`marker`), so that the sink can tell it
posted a note before; the id of the note an event adds is :func:`event_id` (the occurrence for incidents and
regressions, a digest of the whole event for repros and verdicts), and :func:`reopen_id` names the note that
reopens a closed issue. These ids are stored in GitLab: changing one re-posts every note after an upgrade.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime

from processors.model.anomaly import Anomaly
from processors.model.outputs import IncidentEvent, RegressionEvent, ReproEvent, VerdictEvent

FP_LABEL_PREFIX = "trace-repro::fp::"
_ID = re.compile(r"[^A-Za-z0-9_.-]+")

Event = IncidentEvent | RegressionEvent | ReproEvent | VerdictEvent
Filed = IncidentEvent | RegressionEvent  # the kinds that file (or update) the issue of their fingerprint


def fingerprint_label(fingerprint: str) -> str:
    """The scoped label that finds the one issue of a fingerprint."""
    return FP_LABEL_PREFIX + _ID.sub("_", fingerprint)


def event_id(event: Event) -> str:
    """The id of the note an event adds: its occurrence for incidents and regressions, a digest of its identity
    otherwise (a verdict's fingerprint, build and outcome), so a replayed event, or one a newer release gives more
    fields, is recognised as posted."""
    if isinstance(event, IncidentEvent):
        return "incident-" + _ID.sub("_", event.occurrence)
    if isinstance(event, RegressionEvent):
        return "regression-occurrence-" + _ID.sub("_", event.occurrence)
    fields = type(event).identity
    key = "\x1f".join(str(getattr(event, f)) for f in fields) if fields else event.model_dump_json()
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return f"{event.kind}-{digest}"


def reopen_id(event: Filed) -> str:
    """The id of the note that reopens a closed issue because ``event`` happened again."""
    prefix = "regression-" if isinstance(event, IncidentEvent) else "recurrence-"
    return prefix + event.occurrence


def marker(note_id: str) -> str:
    """The hidden first line of a note; a note carrying it is never posted twice."""
    return f"<!-- trace-repro:event:{_ID.sub('_', note_id)} -->"


def anomaly_name(anomaly: str) -> str:
    """``Lost update`` for ``lost_update``; an anomaly this build does not know is capitalised the same way."""
    try:
        return Anomaly(anomaly).label
    except ValueError:
        return anomaly.replace("_", " ").capitalize()


def iso(unix_ms: float) -> str:
    """A Unix time in milliseconds as ISO 8601 UTC with millisecond precision."""
    return datetime.fromtimestamp(unix_ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def closed_since(fixed_after_ms: float | None) -> str:
    """Why a reopened issue was closed: a verified fix (from the start of its verdict window) or a person."""
    if fixed_after_ms is None:
        return "the issue was closed"
    return f"it was verified fixed (verdict window from {iso(fixed_after_ms)})"


def duplicate_note(winner_iid: int) -> str:
    """The note on an issue closed because another instance filed the same fingerprint first."""
    return (
        f"{marker(f'duplicate-of-{winner_iid}')}\n"
        f"Closing as a duplicate of #{winner_iid}: another trace-repro instance filed the same fingerprint "
        "concurrently; the issue with the lowest number is kept.\n"
    )


__all__ = [
    "FP_LABEL_PREFIX",
    "Event",
    "Filed",
    "anomaly_name",
    "closed_since",
    "duplicate_note",
    "event_id",
    "fingerprint_label",
    "iso",
    "marker",
    "reopen_id",
]
