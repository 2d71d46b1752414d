"""``trace-repro``: the command line.

trace-repro local up [--env-file F] [--capture schema.table ...]   start the local engines
trace-repro local status                                           PID, health and address of each
trace-repro local env                                              the TRACE_REPRO_* variables (eval-able)
trace-repro local capture schema.table ...                         have Debezium capture tables
trace-repro local down [--keep-data]                               stop them all
trace-repro run [--config FILE] [--stage all|ingest|entities]      the daemon
trace-repro contract add --fingerprint F --signature S [...]       add a proof contract
trace-repro gate --diff F --description F --contract F.json        merge-request gate for a fix
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from streamer import contract_cli, gate
from streamer.engines import ALL, EngineError, LocalEngines


def _local(args: argparse.Namespace) -> int:
    local = LocalEngines()
    match args.action:
        case "up":
            local.up(args.engines or ALL)
            if args.capture:
                local.capture(args.capture, topic_prefix=args.topic_prefix)
            for name, seconds in local.timings.items():
                print(f"started {name:<9} in {seconds:6.2f}s")
            _print_status(local)
            if args.env_file:
                Path(args.env_file).write_text(_exports(local))
                print(f"wrote {args.env_file}")
            return 0
        case "status":
            return 0 if _print_status(local) else 1
        case "env":
            print(_exports(local), end="")
            return 0
        case "capture":
            local.capture(args.tables, topic_prefix=args.topic_prefix)
            print(f"capturing {', '.join(args.tables)} into {args.topic_prefix}.<schema>.<table>")
            return 0
        case "down":
            pids = local.down(keep_data=args.keep_data)
            print(f"stopped {len(pids)} engine(s): PIDs {' '.join(map(str, pids)) or '-'}")
            return 0
    raise AssertionError(args.action)


def _print_status(local: LocalEngines) -> bool:
    rows = local.status()
    print(f"{'engine':<9} {'pid':>7}  {'state':<9} address")
    for s in rows:
        state = "healthy" if s.healthy else ("unhealthy" if s.running else "stopped")
        print(f"{s.name:<9} {s.pid or '-':>7}  {state:<9} {s.address}")
    return all(s.healthy for s in rows)


def _exports(local: LocalEngines) -> str:
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in local.environment().items())


def _run(args: argparse.Namespace) -> int:
    from streamer.daemon import run

    stages = ("ingest", "entities") if args.stage == "all" else (args.stage,)
    return run(args.config, stages)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trace-repro", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command", required=True)

    local = sub.add_parser("local", help="start, inspect and stop the local engines")
    actions = local.add_subparsers(dest="action", required=True)
    up = actions.add_parser("up", help="start Kafka, FalkorDB, PostgreSQL and Kafka Connect + Debezium")
    up.add_argument("engines", nargs="*", metavar="ENGINE", help=f"a subset of: {', '.join(ALL)} (default: all)")
    up.add_argument("--env-file", help="also write the TRACE_REPRO_* addresses to this file as shell exports")
    up.add_argument("--capture", nargs="+", metavar="SCHEMA.TABLE", help="tables for Debezium to capture")
    up.add_argument("--topic-prefix", default="shop", help="Debezium topic.prefix (default: shop)")
    actions.add_parser("status", help="PID, health and address of each engine (exit 1 unless all healthy)")
    actions.add_parser("env", help="print the TRACE_REPRO_* addresses as shell exports")
    cap = actions.add_parser("capture", help="have Debezium capture tables into <prefix>.<schema>.<table>")
    cap.add_argument("tables", nargs="+", metavar="SCHEMA.TABLE")
    cap.add_argument("--topic-prefix", default="shop")
    down = actions.add_parser("down", help="stop every engine and remove its data")
    down.add_argument("--keep-data", action="store_true", help="keep data and logs for inspection")

    contract_cli.add_parser(sub)  # trace-repro contract add ...
    gate.add_parser(sub)  # trace-repro gate --diff F --description F --contract F.json
    run = sub.add_parser("run", help="run the daemon")
    run.add_argument("--config", type=Path, help="TOML config file (default: TRACE_REPRO_* environment only)")
    run.add_argument(
        "--stage",
        choices=["all", "ingest", "entities"],
        default="all",
        help="run both stages (default) or one, to scale them as separate consumer groups",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "local":
            return _local(args)
        if args.command in ("contract", "gate"):
            return int(args.handler(args))
        return _run(args)
    except EngineError as exc:
        print(f"trace-repro: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
