"""Reading a ``/metrics`` endpoint from outside (the daemon's, the peer Collector's): the bench, the soak and the
shipped-windows run each parse what they follow from this text."""

from __future__ import annotations

import urllib.error
import urllib.request


def fetch_metrics(port: int, timeout_s: float = 5.0) -> str | None:
    """The Prometheus text of ``http://127.0.0.1:<port>/metrics``; None when it does not answer within ``timeout_s``."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as response:
            return str(response.read().decode())
    except (urllib.error.URLError, OSError):
        return None
