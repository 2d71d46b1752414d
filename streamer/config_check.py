"""``trace-repro config check [--config F]``: validate a configuration the way the daemon loads it.

The file and the ``TRACE_REPRO_*`` environment are loaded by :func:`streamer.config.load`, exactly as ``trace-repro
run`` does, and every problem is printed, not only the first: a ``TRACE_REPRO_*`` name nothing reads (the daemon
would run with that setting's default) and a key the file has that no section knows, each with the closest valid
name; what the settings' validation refuses, by key; a ``kafka.cdc_pattern`` that is no regular expression. Exit
status 0 when the configuration is good, 2 with the problems.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path

from streamer import config, config_reference
from streamer.config_names import PREFIX, unknown_env, unknown_keys


def _did_you_mean(near: str | None) -> str:
    return f"; did you mean {near}?" if near else ""


def problems(path: Path | None, env: Mapping[str, str]) -> list[str]:
    """Every problem of the configuration in ``path`` (optional) and ``env``, one line each; [] when it is good."""
    model = config.settings_model()
    env_typos = unknown_env(env, model)
    out = [f"{name}: unknown environment name (nothing reads it){_did_you_mean(near)}" for name, near in env_typos]
    reported = {name.removeprefix(PREFIX).lower().replace("__", ".") for name, _ in env_typos}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            return [*out, f"{path}: {exc}"]
        file_typos = unknown_keys(data, model)
        out += [f"{path}: unknown key {key}{_did_you_mean(near)}" for key, near in file_typos]
        reported |= {key for key, _ in file_typos}
    try:
        settings = config.load(path, env=dict(env))
    except config.ConfigError as exc:  # its first line says where; then one line per key: "  key: message"
        lines = str(exc).splitlines()
        refused = [line.strip() for line in lines[1:]] or lines[:1]
        return out + [line for line in refused if line.split(":", 1)[0] not in reported]
    try:
        re.compile(settings.kafka.cdc_pattern)
    except re.error as exc:
        out.append(f"kafka.cdc_pattern: not a regular expression: {exc}")
    return out


def check(args: argparse.Namespace) -> int:
    """The command: print the problems (or that there are none); 0 when good, 2 otherwise."""
    found = problems(args.config, os.environ)
    where = f"{args.config} + environment" if args.config else "environment only"
    if not found:
        print(f"config ok ({where})")
        return 0
    print(f"config has {len(found)} problem(s) ({where}):", file=sys.stderr)
    for line in found:
        print(f"  {line}", file=sys.stderr)
    return 2


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cfg = sub.add_parser("config", help="check a configuration (file + TRACE_REPRO_* environment), or print the "
                         "configuration reference")  # fmt: skip
    actions = cfg.add_subparsers(dest="action", required=True)
    c = actions.add_parser("check", help="validate it as the daemon loads it; name the closest valid key of a typo",
                           description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    c.add_argument("--config", type=Path, help="the daemon's TOML config (default: TRACE_REPRO_* environment only)")
    c.set_defaults(handler=check)
    config_reference.add_parser(actions)  # trace-repro config reference [--output F]
