"""``[codeloc]``: where the services' source checkouts are, for locating code that spans do not name."""

from __future__ import annotations

from pydantic import Field

from processors.api.component import Section


class CodeLocConfig(Section):
    """The code locator: recovers an access's function, file and line when its spans carry no ``code.*``.

    Auto-instrumentation records no ``code.function.name`` / ``code.file.path`` / ``code.line.number``; with a
    checkout of the service's source configured, the locator reads it once (libcst) and names the code from an
    ``exception.stacktrace``, from the request's route and method (Flask, FastAPI, Django), or from the statement's
    shape (its SQL text, or the ORM model and attributes behind it). Without a checkout, only ``code.*`` is used.
    """

    source_root: str = Field("", description="checkout of the services' source; empty: spans' code.* only")
    services: dict[str, str] = Field(
        default_factory=dict, description="service.name -> its checkout (absolute, or relative to source_root)"
    )
    source_map: dict[str, str] = Field(
        default_factory=dict, description="path prefix recorded in stack traces -> local dir (e.g. /app -> .)"
    )
    exclude: list[str] = Field(
        default_factory=lambda: ["tests", "test", "test_*.py", "*_test.py", "conftest.py", "*Test.java"],
        description="path parts (globs) not read: tests issue the same SQL as the code they test",
    )
    max_files: int = Field(5_000, ge=1, description="source files read per checkout (the rest counted dropped)")
    max_file_bytes: int = Field(1_000_000, ge=1, description="a source file larger than this is not read")
    max_cached_requests: int = Field(
        10_000, ge=1, description="located requests remembered (service, route, method, statements)"
    )
    max_candidates: int = Field(8, ge=1, description="candidate functions named when the code is ambiguous")
    call_depth: int = Field(3, ge=0, le=8, description="calls followed from a handler to the code that issues SQL")
