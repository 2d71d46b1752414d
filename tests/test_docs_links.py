"""Every relative link of the README and of docs/*.md resolves: the file exists, and an anchor names a heading of
that file (GitHub's anchors: lower case, punctuation removed, spaces as hyphens)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "bench" / "RESULTS.md"]


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def broken_links(path: Path) -> list[str]:
    """The relative links of ``path`` (outside code blocks) whose file or anchor does not exist."""
    out = []
    for target in LINK.findall(FENCE.sub("", path.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...
            continue
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.exists():
            out.append(f"{target}: no such file")
        elif anchor and (resolved.suffix != ".md" or anchor not in _anchors(resolved)):
            out.append(f"{target}: no heading #{anchor}")
    return out


def test_every_relative_link_resolves() -> None:
    """No README or docs link points at a file or heading that is not there."""
    broken = {str(p.relative_to(REPO)): b for p in _documents() if (b := broken_links(p))}
    assert broken == {}


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    """The check itself: a missing file and a missing heading are both reported; a code block is not read."""
    (tmp_path / "other.md").write_text("# Other\n\n## A heading, with punctuation\n")
    doc = tmp_path / "doc.md"
    doc.write_text("[ok](other.md#a-heading-with-punctuation) [gone](missing.md) [bad](other.md#nowhere)\n"
                   "```\n[in code](nothing.md)\n```\n[web](https://example.com)\n")  # fmt: skip
    assert broken_links(doc) == ["missing.md: no such file", "other.md#nowhere: no heading #nowhere"]


def test_the_readme_stays_a_users_document() -> None:
    """The README is short enough to read (measurements live in bench/RESULTS.md, design in docs/)."""
    assert len((REPO / "README.md").read_text().splitlines()) <= 350
