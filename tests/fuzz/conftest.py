"""The fuzz folder's hypothesis profiles (see ``tests.fuzz.profiles``): registered here, applied by each test's
``fuzz`` decorator to that test only, never to the rest of the suite."""

from __future__ import annotations

from tests.fuzz.profiles import register

register()
