"""What a FIXED verdict does for a tagged build: the receipt goes into the GitLab release of its tag.

The build is a tagged one when its version (``service.version``, or the commit that identified it) is a tag of the
project, as given or with a ``v`` in front (``1.4.2`` or ``v1.4.2``): ``GET /projects/:id/repository/tags/:tag``.
Then the tag's release gets the verdict's receipt appended to its description (``PUT /releases/:tag``), or, when
the tag has no release yet, the release is created with it (``POST /releases``). An untagged build is left alone.

Once per verdict: the receipt's section starts with a hidden marker holding the verdict's id, and a description
that has it is not changed again (a replay, or a retried step whose answer was lost).
"""

from __future__ import annotations

from typing import Any

from gitlab.exceptions import GitlabError

from processors.model.outputs import VerdictEvent
from sinks.gitlab.body_verdict import verdict_note
from sinks.gitlab.markdown import event_id, marker


def _missing(exc: GitlabError) -> bool:
    """A 404 about the thing asked for (not the project: that one parks the sink)."""
    return exc.response_code == 404 and "project not found" not in str(exc.error_message).lower()


def _tag(project: Any, version: str) -> str | None:
    if not version:
        return None
    for tag in dict.fromkeys((version, version if version.startswith("v") else "v" + version)):
        try:
            project.tags.get(tag)
            return tag
        except GitlabError as exc:
            if not _missing(exc):
                raise
    return None


def release_step(project: Any, e: VerdictEvent) -> str | None:
    """Attach ``e``'s receipt to its build's release (one retryable step): the tag, or None when untagged or done."""
    tag = _tag(project, e.version)
    if tag is None:
        return None
    section = "## trace-repro: proof of fix\n\n" + verdict_note(e).replace(marker(event_id(e)), marker(_id(e)), 1)
    try:
        release = project.releases.get(tag)
    except GitlabError as exc:
        if not _missing(exc):
            raise
        project.releases.create({"tag_name": tag, "name": tag, "description": section})
        return tag
    text = str(release.description or "")
    if marker(_id(e)) in text:
        return None
    release.description = (text.rstrip("\n") + "\n\n" + section) if text.strip() else section
    release.save()
    return tag


def _id(e: VerdictEvent) -> str:
    return event_id(e) + "-release"


__all__ = ["release_step"]
