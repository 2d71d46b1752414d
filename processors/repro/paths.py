"""Where repro files may go: fingerprints checked before they name anything, every path resolved under its root.

An incident's fingerprint is data from the topic, so before it names a directory it must look like what the collision
detector makes (:func:`processors.detectors.collisions.views.fingerprint`: 16 lowercase hex digits), and every
path built from it is resolved (symlinks followed) and must stay under the output directory it was built from: a
crafted fingerprint, or an ``out/work`` that is a symlink to elsewhere, is refused (:class:`UnsafePath`), never
written to or deleted.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

FINGERPRINT: Final = re.compile(r"[0-9a-f]{16}")


class UnsafePath(ValueError):
    """A path built from incident data that would leave the directory it belongs under."""


def valid_fingerprint(fingerprint: object) -> bool:
    """Whether ``fingerprint`` is a collision fingerprint (16 lowercase hex digits) and nothing else."""
    return isinstance(fingerprint, str) and FINGERPRINT.fullmatch(fingerprint) is not None


def under(root: Path, *parts: str) -> Path:
    """``root / parts``, resolved, when it is ``root`` itself or inside it (resolved too); raises UnsafePath."""
    base = root.resolve()
    path = base.joinpath(*parts).resolve()
    if path != base and not path.is_relative_to(base):
        raise UnsafePath(f"{'/'.join(parts)!r} resolves to {path}, outside {base}")
    return path


__all__ = ["FINGERPRINT", "UnsafePath", "under", "valid_fingerprint"]
