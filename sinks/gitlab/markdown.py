"""What every issue, note and body module shares: the labels, the fingerprint tag, note ids and markers, times, names.

An issue is found by its fingerprint tag ``trace-repro::fp::<fingerprint>`` (:func:`fingerprint_label`), written in
its description's footer: the sink searches the project's issues for the fingerprint and keeps those whose
description (or, for issues filed before, labels) carry the tag. Its labels are a fixed set (:func:`issue_labels`):
the configured ones, ``anomaly::<class>`` (an anomaly or a registered finding type) and, for a finding of high or low
severity (incidents), ``severity::<high|low>``. Releases before this one
made the tag a label, one per defect, so a project's label list grew without bound; an issue found with that label
is migrated when the sink next touches it (the label is removed from the issue and deleted from the project). A note
starts with the hidden marker ``<!-- trace-repro:event:<id> -->`` (:func:`marker`), so that the sink can tell it
posted a note before; the id of the note an event adds is :func:`event_id` (the occurrence for findings, a digest of
the whole event for repros and verdicts), and :func:`reopen_id` names the note that
reopens a closed issue. These ids are stored in GitLab: changing one re-posts every note after an upgrade.
"""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime

from processors.model.anomaly import Anomaly
from processors.model.finding import FINDING_TYPES, Finding
from processors.model.outputs import ReproEvent, VerdictEvent
from sinks.gitlab.escape import code

FP_LABEL_PREFIX = "trace-repro::fp::"
SEVERITIES = ("high", "low")
_TAG = re.compile(re.escape(FP_LABEL_PREFIX) + r"([A-Za-z0-9_.-]+)")
_ID = re.compile(r"[^A-Za-z0-9_.-]+")

Event = Finding | ReproEvent | VerdictEvent
Filed = Finding  # every finding files (or updates) the issue of its fingerprint
# The note ids of the kinds that came first (stored in GitLab: they must not change); any other kind's note of an
# occurrence is ``<kind>-occurrence-<occurrence>``, and a reopening ``recurrence-<occurrence>``.
_OCCURRENCE_PREFIX = {"incident": "incident-", "regression": "regression-occurrence-"}
_REOPEN_PREFIX = {"incident": "regression-"}


def kind_of(event: Event) -> str:
    """The published ``kind`` of an event (every published model declares one)."""
    return str(getattr(event, "kind", ""))


def fingerprint_label(fingerprint: str) -> str:
    """The tag that finds the one issue of a fingerprint (in its description; a label before this release)."""
    return FP_LABEL_PREFIX + _ID.sub("_", fingerprint)


def fingerprint_of(description: str | None) -> str | None:
    """The fingerprint an issue's description is tagged with (the last tag: the footer's), or None."""
    found = _TAG.findall(description or "")
    return found[-1] if found else None


def classes() -> list[str]:
    """Every class an issue is labelled with: the :class:`Anomaly` values, then the registered finding types."""
    known = [a.value for a in Anomaly]
    return [*known, *sorted(t for t in FINDING_TYPES if t not in known)]


def anomaly_label(anomaly: str) -> str:
    """``anomaly::<class>``: an :class:`Anomaly` value or a registered finding type (``other`` for a class this
    build does not know: the label set stays fixed)."""
    return f"anomaly::{anomaly if anomaly in classes() else 'other'}"


def severity_label(e: Filed) -> str | None:
    """``severity::high`` or ``severity::low`` by the finding's level; None for a medium one (a regression)."""
    level = e.level()
    return f"severity::{level}" if level in SEVERITIES else None


def issue_labels(base: tuple[str, ...], anomaly: str, e: Filed) -> list[str]:
    """The labels of ``e``'s issue: ``base`` (configured), its class and severity; a fixed set in all."""
    extra = [anomaly_label(anomaly), severity_label(e)]
    return list(dict.fromkeys([*base, *(x for x in extra if x)]))


def scheme_labels() -> list[str]:
    """Every label the sink adds besides the configured ones (created up front, with a description)."""
    return [*(f"anomaly::{c}" for c in classes()), "anomaly::other", *(f"severity::{s}" for s in SEVERITIES)]


def event_id(event: Event) -> str:
    """The id of the note an event adds: its occurrence for incidents and regressions, a digest of its identity
    otherwise (a verdict's fingerprint, build and outcome), so a replayed event, or one a newer release gives more
    fields, is recognised as posted."""
    if isinstance(event, Finding):
        kind = kind_of(event)
        prefix = _OCCURRENCE_PREFIX.get(kind, f"{kind}-occurrence-")
        return prefix + _ID.sub("_", event.occurrence)
    fields = type(event).identity
    key = "\x1f".join(str(getattr(event, f)) for f in fields) if fields else event.model_dump_json()
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return f"{kind_of(event)}-{digest}"


def reopen_id(event: Filed) -> str:
    """The id of the note that reopens a closed issue because ``event`` happened again."""
    return _REOPEN_PREFIX.get(kind_of(event), "recurrence-") + event.occurrence


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


def footer(fingerprint: str, schema_version: int) -> list[str]:
    """The last lines of every issue description: who filed it, the schema and the fingerprint tag (which finds it)."""
    return [
        "---",
        f"<sub>Filed by trace-repro · schema v{schema_version} · {code(fingerprint_label(fingerprint))}</sub>",
    ]


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
    "anomaly_label",
    "anomaly_name",
    "classes",
    "closed_since",
    "duplicate_note",
    "event_id",
    "fingerprint_label",
    "fingerprint_of",
    "footer",
    "iso",
    "issue_labels",
    "kind_of",
    "marker",
    "reopen_id",
    "scheme_labels",
    "severity_label",
]
