"""``python -m bench.corpus record [--out DIR] [--scenario NAME ...] [--rounds N]``: record the corpus fixtures."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.corpus.apps import SCENARIOS
from bench.corpus.recorder import FIXTURES, ROUNDS, record


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.corpus", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run every scenario on the local engines and record its Kafka messages")
    rec.add_argument("--out", type=Path, default=FIXTURES, help=f"fixture directory (default {FIXTURES})")
    rec.add_argument("--scenario", action="append", choices=list(SCENARIOS), help="only this scenario (repeatable)")
    rec.add_argument("--rounds", type=int, default=ROUNDS, help="rounds of the bug and of each control")
    a = p.parse_args(argv)
    manifests = record(a.out, a.scenario or tuple(SCENARIOS), a.rounds)
    for m in manifests:
        size = sum((a.out / f"{m.scenario}{ext}").stat().st_size for ext in (".jsonl", ".manifest.json"))
        print(f"{m.scenario:<20} {len(m.rounds)} rounds  {size / 1024:6.1f} KiB  -> {a.out}/{m.scenario}.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
