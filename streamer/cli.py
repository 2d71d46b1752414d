"""``trace-repro``: the command line.

trace-repro local up [--env-file F] [--capture schema.table ...]   start the local engines
trace-repro local status                                           PID, health and address of each
trace-repro local env                                              the TRACE_REPRO_* variables (eval-able)
trace-repro local capture schema.table ...                         have Debezium capture tables
trace-repro local down [--keep-data]                               stop them all
trace-repro run [--config FILE] [--stage all|ingest|entities]      the daemon (stage 1 as N worker processes;
                [--workers N|auto]                                 default: the `workers` setting, 1)
trace-repro contract add --fingerprint F --signature S [...]       add a proof contract
trace-repro gate --diff F --description F --contract F.json        merge-request gate for a fix
                 [--junit F.xml] [--codequality F.json]            (its tests' run; a Code Quality report)
trace-repro mcp [--config FILE] [--transport stdio|http]            the MCP server for agents (read-only by default)
trace-repro config check [--config FILE]                           validate a config; name the closest key of a typo
trace-repro doctor [--config FILE] [--messages N] [--seconds S]    what the telemetry lacks, per service and table,
                   [--from end|beginning] [--json]                 and what to turn on
trace-repro findings list [--service S] [--since 2h] [--json]      the findings the daemon keeps (its graph)
trace-repro findings show FINGERPRINT [--json]                     one finding's evidence, repro and verdicts
trace-repro --version                                              the installed version
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from streamer import config_check, contract_cli, deploy_cli, findings_cli, gate
from streamer.doctor import command as doctor
from streamer.engines import ALL, KNOWN, EngineError, LocalEngines
from streamer.version import __version__


def _local(args: argparse.Namespace) -> int:
    local = LocalEngines()
    match args.action:
        case "up":
            local.up([*(args.engines or ALL), *(["registry"] if args.registry else [])])
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

    if args.log_level:  # over the file and the environment, and inherited by the worker processes
        os.environ["TRACE_REPRO_LOG_LEVEL"] = args.log_level
    stages = ("ingest", "entities") if args.stage == "all" else (args.stage,)
    return run(args.config, stages, args.workers)


def _workers(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', got {value!r}")
    return n


def _mcp(args: argparse.Namespace) -> int:
    from streamer.config import ConfigError
    from streamer.mcp.server import MissingToken, serve
    from streamer.mcp.settings import resolve

    try:
        settings = resolve(args.config, run_repro=args.allow_run_repro, contracts=args.allow_contracts)
        if args.transport == "http" and not settings.token:
            raise MissingToken("streamable HTTP needs a bearer token: set TRACE_REPRO_MCP_TOKEN (refusing to serve)")
    except (ConfigError, MissingToken) as exc:
        print(f"trace-repro mcp: {exc}", file=sys.stderr)
        return 2
    serve(settings, args.transport, args.host, args.port)
    return 0


def _mcp_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    m = sub.add_parser(
        "mcp",
        help="the Model Context Protocol server over the live graph (for coding agents)",
        description="Serve trace-repro's incidents, repros, verdicts and topology as MCP tools. "
        "Read-only unless --allow-run-repro / --allow-contracts. HTTP needs TRACE_REPRO_MCP_TOKEN.",
    )
    m.add_argument("--config", type=Path, help="the daemon's TOML config (default: TRACE_REPRO_* environment only)")
    m.add_argument("--transport", choices=["stdio", "http"], default="stdio", help="stdio (default) or streamable HTTP")
    m.add_argument("--host", default="127.0.0.1", help="HTTP listen address (default 127.0.0.1)")
    m.add_argument("--port", type=int, default=8765, help="HTTP port (default 8765); the endpoint is /mcp")
    m.add_argument("--allow-run-repro", action="store_true", help="let run_repro re-run stored repro tests")
    m.add_argument("--allow-contracts", action="store_true", help="let add_contract publish proof contracts")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trace-repro", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--version", action="version", version=f"trace-repro {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    local = sub.add_parser("local", help="start, inspect and stop the local engines")
    actions = local.add_subparsers(dest="action", required=True)
    up = actions.add_parser("up", help="start Kafka, FalkorDB, PostgreSQL and Kafka Connect + Debezium")
    up.add_argument("engines", nargs="*", metavar="ENGINE", help=f"a subset of: {', '.join(KNOWN)} (default: all "
                    "but the registry)")  # fmt: skip
    up.add_argument("--registry", action="store_true", help="also start the schema registry (Debezium's Avro form)")
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
    deploy_cli.add_parser(sub)  # trace-repro deploy mark --service S [--at T] [--name N]
    gate.add_parser(sub)  # trace-repro gate --diff F --description F --contract F.json
    _mcp_parser(sub)  # trace-repro mcp [--transport stdio|http] ...
    config_check.add_parser(sub)  # trace-repro config check [--config F]
    doctor.add_parser(sub)  # trace-repro doctor [--messages N] [--seconds S] [--from end|beginning] [--json]
    findings_cli.add_parser(sub)  # trace-repro findings list|show [...] [--json]
    run = sub.add_parser("run", help="run the daemon")
    run.add_argument("--config", type=Path, help="TOML config file (default: TRACE_REPRO_* environment only)")
    run.add_argument(
        "--stage",
        choices=["all", "ingest", "entities"],
        default="all",
        help="run both stages (default) or one, to scale them as separate consumer groups",
    )
    run.add_argument(
        "--workers",
        type=_workers,
        metavar="N|auto",
        help="stage 1 as N worker processes of one consumer group under a supervisor (stage 2 in one more); "
        "1 = everything in this process; default: the `workers` setting, auto = the cores",
    )
    run.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], type=str.upper,
                     help="the least severe log lines written (default: the `log_level` setting, INFO)")  # fmt: skip
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "local":
            return _local(args)
        if args.command in ("contract", "deploy", "gate", "config", "doctor", "findings"):
            return int(args.handler(args))
        if args.command == "mcp":
            return _mcp(args)
        return _run(args)
    except EngineError as exc:
        print(f"trace-repro: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
