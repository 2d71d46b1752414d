"""A release archive fetched once into the cache, checked against the SHA-512 pinned in the code (the digest Maven
Central publishes next to it), so that a corrupt or substituted download is refused rather than run."""

from __future__ import annotations

import hashlib
import os
import shutil
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from streamer.engines.process import EngineError

CHUNK = 1 << 20


def sha512_of(path: Path) -> str:
    digest = hashlib.sha512()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def pinned(url: str, target: Path, sha512: str, *, unreachable: Callable[[object], str]) -> None:
    """Download ``url`` to ``target`` (through a process-private partial file, renamed once complete and checked);
    ``unreachable(reason)`` is the error's text when it cannot be downloaded (what needs it, what to do)."""
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    digest = hashlib.sha512()
    try:
        with urllib.request.urlopen(url, timeout=60) as resp, open(partial, "wb") as out:  # noqa: S310 - https URL
            while chunk := resp.read(CHUNK):
                digest.update(chunk)
                out.write(chunk)
    except (urllib.error.URLError, OSError) as exc:
        partial.unlink(missing_ok=True)
        raise EngineError(unreachable(getattr(exc, "reason", exc))) from exc
    if digest.hexdigest() != sha512:
        partial.unlink(missing_ok=True)
        raise EngineError(f"{url} does not match its pinned SHA-512 (got {digest.hexdigest()[:16]}…): not used")
    partial.replace(target)


def publish(staging: Path, home: Path, marker: str) -> None:
    """Mark the unpacked (or resolved) ``staging`` complete with ``marker`` and move it to ``home``, unless another
    process published ``home`` first (then ``staging`` is left for the caller to remove)."""
    (staging / ".complete").write_text(marker)
    if not (home / ".complete").exists():
        shutil.rmtree(home, ignore_errors=True)
        staging.rename(home)
