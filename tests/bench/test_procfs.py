"""``bench.procfs``: what the bench and the soak read of the daemon's processes from ``/proc``."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.procfs import proc_cpu_s, proc_mb, process_tree


def _gone_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_the_tree_holds_a_process_and_its_children_and_sizes_are_read() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        tree = process_tree(os.getpid())
        assert tree[0] == os.getpid() and child.pid in tree
        assert process_tree(child.pid) == [child.pid]
        rss, hwm, pss = (
            proc_mb(os.getpid(), "VmRSS"),
            proc_mb(os.getpid(), "VmHWM"),
            proc_mb(os.getpid(), "Pss", "smaps_rollup"),
        )
        assert rss is not None and hwm is not None and pss is not None
        assert 0 < rss <= hwm and pss > 0
        assert proc_mb(os.getpid(), "NoSuchKey") is None
        cpu = proc_cpu_s(os.getpid())
        assert cpu is not None and cpu > 0
    finally:
        child.kill()
        child.wait()


def test_a_process_that_is_gone_reads_as_none() -> None:
    gone = _gone_pid()
    assert proc_mb(gone, "VmRSS") is None and proc_cpu_s(gone) is None and proc_cpu_s(None) is None
