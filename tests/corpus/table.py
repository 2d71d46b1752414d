"""``python -m tests.corpus.table``: the corpus table of docs/detection.md, computed by running everything it claims.

One row per scenario: its class; how many bug rounds the replay of its fixture finds as designed (the right class,
culprit and victim) and how many control rounds stay clean (``tests.corpus.replay``, in process, the daemon's
default configuration); whether the SQL-level repro of its first bug round's incident fails RED, faithfully; and
the repair strategy the planner picks first and whether the repaired repro passes GREEN (``tests.corpus.repros``:
the daemon's repro worker). The repros run on the PostgreSQL of a running ``trace-repro local up`` when it is
healthy, else on one started for this run in a private directory (and stopped at its end).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from processors.model.outputs import ReproEvent
from streamer.engines import Layout, LocalEngines
from streamer.logs import configure
from tests.corpus.expectations import judge_round, stray_incidents
from tests.corpus.replay import recorded_scenarios
from tests.corpus.repros import BUGS, fixture, prove_all, replayed

HEADER = ("class", "bug rounds found", "control rounds clean", "repro RED", "repair (strategy) GREEN")


@contextmanager
def postgres() -> Iterator[str]:
    """The DSN of a healthy PostgreSQL: the running local engines', else one of our own."""
    shared = LocalEngines()
    if any(s.name == "postgres" and s.healthy for s in shared.status()):
        print(f"repros on the running local engines' PostgreSQL ({shared.layout.run_dir})", file=sys.stderr)
        yield shared.address("postgres")
        return
    default = Layout.default()
    own = LocalEngines(Layout(config_dir=default.config_dir, cache_dir=default.cache_dir,
                              run_dir=Path(tempfile.mkdtemp(prefix="trace-repro-corpus-"))))  # fmt: skip
    print(f"repros on a PostgreSQL of our own ({own.layout.run_dir})", file=sys.stderr)
    try:
        own.up(["postgres"])
        yield own.address("postgres")
    finally:
        own.down()


def rounds_found(scenario: str) -> tuple[tuple[int, int], tuple[int, int], int]:
    """(bug rounds found, of), (control rounds clean, of), and the incidents that belong to no bug round."""
    incidents = replayed(scenario).incidents
    rounds = fixture(scenario).manifest.rounds
    counts = []
    for bug in (True, False):
        mine = [r for r in rounds if r.is_bug is bug]
        counts.append((sum(not judge_round(r, incidents) for r in mine), len(mine)))
    return counts[0], counts[1], len(stray_incidents(rounds, incidents))


def cell(count: tuple[int, int], strays: int = 0) -> str:
    text = f"{count[0]}/{count[1]}" if count[1] else "—"
    return text + (f", {strays} stray incident(s)" if strays else "")


def red(event: ReproEvent | None) -> str:
    if event is None:
        return "—"
    verdict = "RED" if event.red.status == "failed" else f"not RED ({event.red.status})"
    return verdict + ("" if event.divergence.faithful else ", diverged")


def green(event: ReproEvent | None) -> str:
    if event is None:
        return "—"
    strategy = event.repairs[0].strategy if event.repairs else "no repair"
    if event.green is None:
        return f"{strategy}: no GREEN run"
    return f"{strategy}: {'GREEN' if event.green.status == 'passed' else event.green.status}"


def main() -> int:
    """Print the table; exit 1 unless every round went as designed and every incident was proven."""
    configure("WARNING")  # the worker's log lines go to stderr, and only warnings
    started = time.monotonic()
    with postgres() as dsn, tempfile.TemporaryDirectory(prefix="corpus-table-") as out:
        events = asyncio.run(prove_all(BUGS, dsn, Path(out)))
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    fine = all(e.proven for e in events.values())
    for name in recorded_scenarios():
        event = events.get(name)
        label = f"`{name}`" if name in BUGS else f"— (`{name}`: controls only)"
        bugs, controls, strays = rounds_found(name)
        fine = fine and bugs[0] == bugs[1] and controls[0] == controls[1] and not strays
        lines.append(f"| {label} | {cell(bugs)} | {cell(controls, strays)} | {red(event)} | {green(event)} |")
    print("\n".join(lines))
    print(f"({time.monotonic() - started:.1f} s)", file=sys.stderr)
    return 0 if fine else 1


if __name__ == "__main__":
    sys.exit(main())
