"""The fuzz tests' hypothesis settings, and the ``fuzz`` decorator that runs them: a few hundred examples in ``make
test``, ≥ 10⁵ over the folder in ``make fuzz`` (``HYPOTHESIS_PROFILE=fuzz``).

The default profile is derandomized (a CI failure replays). In the long run each test's examples are split into
chunks of ``CHUNK``, each its own hypothesis run seeded by its index (deterministic too): hypothesis keeps a record of
every choice it explored in a run (a few hundred kB per example of these strategies), which over 10⁴ examples would
take gigabytes; between chunks it is freed. The long run prints, per test, how many examples ran and how long.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
import time
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

DEFAULT = "trace-repro-fuzz-default"
LONG = "trace-repro-fuzz"
CHUNK = 500
_COMMON: dict[str, Any] = {
    "deadline": None,
    "database": None,
    "print_blob": True,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
}


def register() -> None:
    settings.register_profile(DEFAULT, max_examples=100, derandomize=True, **_COMMON)
    settings.register_profile(LONG, max_examples=CHUNK, derandomize=False, **_COMMON)


def long_run() -> bool:
    return os.environ.get("HYPOTHESIS_PROFILE") == "fuzz"


def fuzz(
    *strategies: st.SearchStrategy[Any], examples: int, long_examples: int
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """``@given(*strategies)`` with ``examples`` examples (derandomized) in ``make test``, ``long_examples`` in chunks
    in ``make fuzz``."""
    register()

    def decorate(test: Callable[..., None]) -> Callable[..., None]:
        if not long_run():
            return settings(settings.get_profile(DEFAULT), max_examples=examples)(given(*strategies)(test))
        ran = [0]

        @functools.wraps(test)
        def counted(*args: Any, **kwargs: Any) -> None:
            ran[0] += 1
            test(*args, **kwargs)

        def chunked() -> None:
            started = time.monotonic()
            for chunk in range(math.ceil(long_examples / CHUNK)):
                run = settings(settings.get_profile(LONG), max_examples=CHUNK)(given(*strategies)(counted))
                seed(chunk)(run)()
            print(f"\nfuzz: {test.__name__}: {ran[0]} examples in {time.monotonic() - started:.0f} s")

        chunked.__name__, chunked.__doc__ = test.__name__, test.__doc__
        chunked.__signature__ = inspect.Signature()  # type: ignore[attr-defined]
        return chunked

    return decorate
