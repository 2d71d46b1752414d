"""Worker processes forked from the supervisor, so that the daemon's imports are in memory once for all of them.

A worker started as a new interpreter imports the daemon again (pydantic, aiokafka, falkordb, protobuf, every
component), which the supervisor has imported too to load the configuration. Forked from the supervisor, a worker
shares those pages copy-on-write. ``gc.freeze()`` before the fork moves every object the parent has to the
collector's permanent generation, which no collection walks, in the child or in the parent: a full collection writes
into the header of every object it walks, and so copies every page it touches (the advice of CPython's ``gc``
documentation for fork without exec). The parent never unfreezes them: a full collection in an unfrozen parent would
make most of the shared imports private again (figures in ``bench/RESULTS.md``). What the parent freezes stays until
it exits: a cycle among those objects that becomes garbage later is never collected, which for a supervisor (its
configuration, its worker slots) is nothing. A worker under load still copies the pages it writes to (reference
counts, allocations into the parent's partly free memory pools), which is most of them under load.

The supervisor forks while its asyncio loop runs, which is safe here because the child leaves everything of the
parent's untouched:

- the signals the loop handles are blocked across the fork, and the child clears the loop's wakeup descriptor and
  handlers before unblocking them, so a signal meant for a worker never wakes the supervisor's loop;
- standard output and error are flushed before the fork (a buffered line is never written twice);
- the child closes every inherited descriptor but stdio and the ones it is given (the supervisor's HTTP socket, its
  loop's selector and self-pipe, the other workers' pipes);
- the child runs the worker's ``main`` on a loop of its own (asyncio's running loop is per process) and leaves with
  ``os._exit``: it never returns into the supervisor's stack, and no finalizer of the parent's objects runs in it.

The parent waits for a child on a pidfd (Linux 5.3 or later), as asyncio's own ``PidfdChildWatcher`` does.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn

HANDLED = (signal.SIGTERM, signal.SIGINT)  # the signals the supervisor's loop (and a worker's) handles


class Forked:
    """A forked worker process, with the members of ``asyncio.subprocess.Process`` the supervisor uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd = os.pidfd_open(pid)

    def send_signal(self, sig: int) -> None:
        """Signal the process while it has not been reaped (until then its PID cannot be reused)."""
        if self.returncode is None:
            os.kill(self.pid, sig)

    async def wait(self) -> int:
        """Wait for the process to exit, reap it, and return its status (``-N`` for signal N)."""
        if self.returncode is not None:
            return self.returncode
        loop = asyncio.get_running_loop()
        exited = loop.create_future()
        loop.add_reader(self._pidfd, _settle, exited)
        try:
            await exited
        finally:
            loop.remove_reader(self._pidfd)
        # the pidfd is readable: the process has exited, and this does not block
        _, status = os.waitpid(self.pid, os.WNOHANG)  # noqa: ASYNC222
        os.close(self._pidfd)
        self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def fork(main: Callable[[Sequence[str]], int], argv: Sequence[str], keep: Sequence[int]) -> Forked:
    """Fork a child that runs ``main(argv)`` with stdio and the descriptors ``keep`` open; its exit status is what
    ``main`` returns (1 for an exception, which is printed)."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
    gc.freeze()  # for good, in the parent too: see the module docstring
    try:
        pid = os.fork()
        if pid == 0:
            _child(main, argv, keep, mask)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return Forked(pid)


def _child(main: Callable[[Sequence[str]], int], argv: Sequence[str], keep: Sequence[int],
           mask: set[int | signal.Signals]) -> NoReturn:  # fmt: skip
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for sig in HANDLED:
            signal.signal(sig, signal.SIG_DFL)
        _close_inherited(keep)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        code = main(argv)
    except SystemExit as exc:  # as the interpreter exits: an int is the status, anything else is printed, status 1
        if isinstance(exc.code, int):
            code = exc.code
        elif exc.code is None:
            code = 0
        else:
            print(exc.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _close_inherited(keep: Sequence[int]) -> None:
    """Close every descriptor from 3 up but those in ``keep``."""
    low = 3
    for fd in sorted(set(keep)):
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))
