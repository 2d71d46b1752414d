"""Race points: the seams where a concurrent request can interleave with a handler, and the duel that uses them.

Handlers call ``race_point()`` right before their conflicting step, ``race_point("written")`` right after their
conflicting write (still inside the transaction, holding its row locks) and ``race_point("committed")`` right after
their transaction committed. In production these do nothing; the corpus runner installs a hook per request thread.

:func:`duel` runs two requests, a *leader* and a *follower*, in their own threads and forces one interleaving:

- both wait for each other at their race point (a ``threading.Barrier``), so that everything either did before it
  (an unlocked read, a count) happened before either goes on;
- the follower then waits for the leader to reach ``Choreography.follow`` (its conflicting write, or its commit),
  plus ``delay_s``;
- the leader holds its locks for ``hold_s`` at ``written``: the follower's conflicting statement is then sent while
  the leader's transaction is still open and waits for its row lock (the lock wait shows in the follower's span);
- the order of commits is recorded at ``committed`` (the follower records after the leader, so a leader that
  commits first is always listed first).

Waits are bounded (``TIMEOUT_S``) and a contender that ends early (it refused, or failed) releases everything it
could have been waited for, so a duel never hangs: a broken interleaving shows as unexpected outcomes instead.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Literal, TypeVar

Point = Literal["race", "written", "committed"]
POINTS: tuple[Point, ...] = ("race", "written", "committed")
TIMEOUT_S = 10.0
LEADER, FOLLOWER = 0, 1
T = TypeVar("T")

_hook: ContextVar[Callable[[Point], None] | None] = ContextVar("corpus_race_hook", default=None)


def race_point(point: Point = "race") -> None:
    """A seam in a handler (a no-op unless a driver installed a hook in this thread)."""
    hook = _hook.get()
    if hook is not None:
        hook(point)


@contextmanager
def racing(hook: Callable[[Point], None]) -> Iterator[None]:
    """Run the body (one request, in the current thread) with ``hook`` at its race points."""
    token = _hook.set(hook)
    try:
        yield
    finally:
        _hook.reset(token)


@dataclass(frozen=True)
class Choreography:
    """How the follower is released after the race point, and how long the leader keeps its locks."""

    follow: Literal["written", "committed"] = "written"
    hold_s: float = 0.0  # the leader sleeps this long at "written", inside its transaction
    delay_s: float = 0.0  # the follower sleeps this long after the leader reached ``follow``


class _Duel:
    def __init__(self, plan: Choreography) -> None:
        self.plan = plan
        self.barrier = threading.Barrier(2)
        self.reached = {(who, p): threading.Event() for who in (LEADER, FOLLOWER) for p in POINTS}
        self.commit_order: list[int] = []
        self._lock = threading.Lock()

    def hook(self, who: int) -> Callable[[Point], None]:
        def at(point: Point) -> None:
            if point == "race":
                if self.reached[(who, "race")].is_set():
                    return  # a retry passes its race point again: the interleaving was forced once
                self.reached[(who, "race")].set()
                with contextlib.suppress(threading.BrokenBarrierError):  # the other ended before its race point
                    self.barrier.wait(TIMEOUT_S)
                if who == FOLLOWER:
                    self.reached[(LEADER, self.plan.follow)].wait(TIMEOUT_S)
                    time.sleep(self.plan.delay_s)
            elif point == "written":
                self.reached[(who, "written")].set()
                if who == LEADER:
                    time.sleep(self.plan.hold_s)
            else:
                if who == FOLLOWER:
                    self.reached[(LEADER, "committed")].wait(TIMEOUT_S)
                with self._lock:
                    self.commit_order.append(who)
                self.reached[(who, "committed")].set()

        return at

    def finished(self, who: int) -> None:
        """A request ended: nobody may wait for a point it will never reach."""
        if not self.reached[(who, "race")].is_set():
            self.barrier.abort()
        for p in POINTS:
            self.reached[(who, p)].set()


def duel(leader: Callable[[], T], follower: Callable[[], T], plan: Choreography) -> tuple[T, T, list[int]]:
    """Run ``leader`` and ``follower`` in two threads, interleaved as ``plan`` says; see the module docstring."""
    state = _Duel(plan)
    results: dict[int, T] = {}
    errors: dict[int, BaseException] = {}

    def contender(who: int, call: Callable[[], T]) -> None:
        try:
            with racing(state.hook(who)):
                results[who] = call()
        except BaseException as exc:  # a request answers with an Outcome; anything else is a bug of the driver
            errors[who] = exc
        finally:
            state.finished(who)

    threads = [threading.Thread(target=contender, args=(who, call), name=f"corpus-{name}")
               for who, call, name in ((LEADER, leader, "leader"), (FOLLOWER, follower, "follower"))]  # fmt: skip
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise next(iter(errors.values()))
    return results[LEADER], results[FOLLOWER], list(state.commit_order)
