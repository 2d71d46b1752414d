"""Live tests run again and again while CPU burners load the machine: does detection hold when the daemon, the
engines and the services fight for the cores?

``python -m bench.under_load [--runs 5] [--burners N] [node ...]`` runs each pytest node ``--runs`` times, one after
the other, each with ``N`` busy-looping processes (default: one per core) alive for the whole run, and prints per
node how many runs passed, with each run's wall time; the result also goes to ``out/under_load.json``. The default
nodes are the corpus's live tests (every scenario through the real Collector, with and without statement parameters,
and every stock stack), whose assertions are the corpus's: every bug round found as its class, every control clean,
nothing stray. A run that fails keeps its pytest output (``out/under_load/<node>-<run>.log``).

Engines come as in the suite (``TRACE_REPRO_TEST_REUSE=1`` reuses the running ones).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import subprocess
import sys
import time
from multiprocessing.synchronize import Event
from pathlib import Path

NODES = (
    "tests/corpus/test_corpus_live.py",
    "tests/corpus/test_stacks_live.py",
)
OUT = Path("out")


def burn(stop: Event) -> None:
    """Spin until told to stop."""
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x = (x * 1_103_515_245 + 12_345) & 0xFFFF_FFFF


def run_once(node: str, run: int, burners: int) -> tuple[bool, float]:
    """One pytest run of ``node`` with ``burners`` busy processes alive throughout; (passed, seconds)."""
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=burn, args=(stop,), daemon=True) for _ in range(burners)]
    for p in procs:
        p.start()
    began = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", node, "-q", "-s", "-p", "no:cacheprovider"],
                              capture_output=True, text=True, check=False)  # fmt: skip
    finally:
        stop.set()
        for p in procs:
            p.join(5)
    seconds = time.monotonic() - began
    if done.returncode != 0:
        log = OUT / "under_load" / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', node)}-{run}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(done.stdout + done.stderr)
    return done.returncode == 0, seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--burners", type=int, default=os.cpu_count() or 1)
    parser.add_argument("nodes", nargs="*", default=list(NODES))
    args = parser.parse_args(argv)
    results: dict[str, list[dict[str, object]]] = {}
    for node in args.nodes:
        for run in range(1, args.runs + 1):
            passed, seconds = run_once(node, run, args.burners)
            results.setdefault(node, []).append({"run": run, "passed": passed, "seconds": round(seconds, 1)})
            print(f"{node} run {run}/{args.runs}: {'passed' if passed else 'FAILED'} in {seconds:.0f} s", flush=True)
    OUT.mkdir(exist_ok=True)
    (OUT / "under_load.json").write_text(json.dumps({"burners": args.burners, "results": results}, indent=2))
    print(f"\n| node ({args.burners} CPU burners) | passed | seconds per run |\n|---|---|---|")
    for node, runs in results.items():
        ok = sum(bool(r["passed"]) for r in runs)
        print(f"| {node} | {ok}/{len(runs)} | {', '.join(str(r['seconds']) for r in runs)} |")
    return 0 if all(r["passed"] for runs in results.values() for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
