"""Worker processes forked from a process running an asyncio loop (``streamer.runtime.workers.fork``)."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import time
from collections.abc import Sequence

from streamer.runtime.workers.fork import fork


def _report(argv: Sequence[str]) -> int:
    """Write which descriptors are open to the one given, then exit with the status given."""
    out, code = int(argv[0]), int(argv[1])
    open_fds = sorted(int(fd) for fd in os.listdir("/proc/self/fd"))
    os.write(out, (" ".join(map(str, open_fds)) + "\n").encode())
    return code


def _exit_via_system_exit(argv: Sequence[str]) -> int:
    raise SystemExit(int(argv[0]) if argv[0].isdigit() else argv[0] or None)


def _crash(argv: Sequence[str]) -> int:
    raise RuntimeError("boom")


def _wait_for_signal(argv: Sequence[str]) -> int:
    os.write(int(argv[0]), b"ready\n")
    time.sleep(60)
    return 0


def test_a_forked_child_keeps_only_stdio_and_what_it_is_given_and_returns_mains_status() -> None:
    async def main() -> tuple[int, str, int]:
        r, w = os.pipe()
        stray_r, stray_w = os.pipe()  # the parent's: the child must not hold them (an EOF would never come)
        child = fork(_report, [str(w), "7"], keep=(w,))
        os.close(w)
        code = await child.wait()
        with os.fdopen(r) as got:
            line = got.read()
        os.close(stray_r)
        os.close(stray_w)
        return code, line, w

    code, line, given = asyncio.run(main())
    assert code == 7
    fds = [int(fd) for fd in line.split()]
    # stdio, the pipe it was given, and the one listdir opened to read /proc/self/fd
    assert len(fds) == 5 and fds[:3] == [0, 1, 2] and given in fds


def test_the_exit_status_of_system_exit_an_exception_and_a_signal() -> None:
    async def main() -> list[int]:
        codes = [await fork(_exit_via_system_exit, [arg], keep=()).wait() for arg in ("3", "", "a reason")]
        codes.append(await fork(_crash, [], keep=()).wait())
        r, w = os.pipe()
        child = fork(_wait_for_signal, [str(w)], keep=(w,))
        os.close(w)
        loop = asyncio.get_running_loop()
        with os.fdopen(r, "rb") as ready:
            await loop.run_in_executor(None, ready.readline)
            child.send_signal(signal.SIGTERM)
            codes.append(await child.wait())
        child.send_signal(signal.SIGTERM)  # reaped: a no-op, never a signal to a recycled PID
        return codes

    assert asyncio.run(main()) == [3, 0, 1, 1, -signal.SIGTERM]


def test_a_signal_to_a_child_never_reaches_the_parents_loop() -> None:
    """The parent's loop handles SIGTERM; a SIGTERM sent to a child kills the child and nothing else."""

    async def main() -> tuple[int, bool]:
        loop = asyncio.get_running_loop()
        parent_got = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, parent_got.set)
        try:
            r, w = os.pipe()
            child = fork(_wait_for_signal, [str(w)], keep=(w,))
            os.close(w)
            with os.fdopen(r, "rb") as ready:
                await loop.run_in_executor(None, ready.readline)
            child.send_signal(signal.SIGTERM)
            code = await child.wait()
            await asyncio.sleep(0.2)
            return code, parent_got.is_set()
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    assert asyncio.run(main()) == (-signal.SIGTERM, False)


def test_the_parents_objects_stay_frozen_after_a_fork() -> None:
    """What the parent had when it forked stays out of its collector's reach: a full collection in the parent would
    write into every object's header and copy every page it shares with its children."""
    before = [object()]  # tracked by the collector, made before the fork

    async def main() -> int:
        return await fork(_exit_via_system_exit, ["0"], keep=()).wait()

    try:
        assert asyncio.run(main()) == 0
        gc.collect()
        assert gc.get_freeze_count() > 0
        assert not any(o is before for o in gc.get_objects()), "the parent's collector walks the pre-fork objects again"
    finally:
        gc.unfreeze()  # this test process is not a supervisor
