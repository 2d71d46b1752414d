"""The shop's HTTP dependencies (a carrier's rate API, a tax service): in-process stand-ins behind a client that
records each call as an instrumented HTTP client does.

Every call is a CLIENT span ``<METHOD> <url.template>`` under the current span (``http.request.method``,
``url.template``, ``server.address``, ``http.response.status_code``; status ERROR on a 5xx answer, as the HTTP
semantic conventions set it for clients), so that the daemon sees the calls the way it sees them from a real
service. The latency is slept (another system over the network), the answer comes from the stand-in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer


class HttpClient:
    """Calls one host's API; one CLIENT span per call (attempt)."""

    def __init__(self, tracer: Tracer, host: str) -> None:
        self.tracer = tracer
        self.host = host

    def call(self, method: str, template: str, answer: Callable[[], int], latency_s: float) -> int:
        """One call of ``template``: wait ``latency_s``, then the status ``answer`` gives."""
        attrs = {"http.request.method": method, "url.template": template, "server.address": self.host}
        name = f"{method} {template}"
        with self.tracer.start_as_current_span(name, kind=SpanKind.CLIENT, attributes=attrs, record_exception=False,
                                               set_status_on_exception=False) as span:  # fmt: skip
            time.sleep(latency_s)
            status = answer()
            span.set_attribute("http.response.status_code", status)
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR))
        return status


class Outage:
    """A dependency's brief unavailability (a restart): it answers 503 until ``until`` (monotonic), then 200."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._until = 0.0

    def begin(self, seconds: float) -> None:
        with self._lock:
            self._until = time.monotonic() + seconds

    def end(self) -> None:
        with self._lock:
            self._until = 0.0

    def answer(self) -> int:
        with self._lock:
            return 503 if time.monotonic() < self._until else 200
