"""The race point: the one place per request where a concurrent request can interleave with it.

Handlers call ``race_point()`` right before their conflicting step. In production it does nothing; the
traffic driver installs a hook (a ``threading.Barrier``) so that contending requests reach their conflicting
steps together. Nothing here sleeps: the interleaving that follows is the database's and the scheduler's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_hook: ContextVar[Callable[[], None] | None] = ContextVar("shop_race_hook", default=None)


def race_point() -> None:
    hook = _hook.get()
    if hook is not None:
        hook()


@contextmanager
def racing(hook: Callable[[], None]) -> Iterator[None]:
    """Run the body (one request, in the current thread) with ``hook`` at its race point."""
    token = _hook.set(hook)
    try:
        yield
    finally:
        _hook.reset(token)
