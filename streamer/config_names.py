"""The names a configuration may use, and the closest valid one for a name that is not one of them.

The settings model (``streamer.config.settings_model``) defines every valid key: its dotted TOML key
(``kafka.group_id``) and its environment name (``TRACE_REPRO_KAFKA__GROUP_ID``, nested sections joined by ``__``),
plus the short aliases ``trace-repro local up`` writes. ``TRACE_REPRO_*`` is also the prefix of the tools' own
variables (the MCP server's, the local engines', the merge-request gate's CI template, the bench and the tests): those
are known here too, so that only a name nothing reads is reported. A name nothing reads is a typo whose setting
silently keeps its default: :func:`unknown_env` names it with the closest valid name (:mod:`difflib`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import BaseModel

PREFIX = "TRACE_REPRO_"
ALIASES = ("TRACE_REPRO_KAFKA_BOOTSTRAP", "TRACE_REPRO_FALKORDB_URL", "TRACE_REPRO_POSTGRES_DSN")
# Read by the tools, not by the daemon's settings: the MCP server (streamer.mcp.settings), the local engines
# (streamer.engines), the merge-request gate's CI template (config/gitlab-ci), the bench and the tests.
TOOL_NAMES = (
    "TRACE_REPRO_MCP_TOKEN", "TRACE_REPRO_MCP_RUN_REPRO", "TRACE_REPRO_MCP_CONTRACTS", "TRACE_REPRO_MCP_TIMEOUT_MS",
    "TRACE_REPRO_MCP_MAX_ROWS", "TRACE_REPRO_MCP_MAX_RESULT_BYTES", "TRACE_REPRO_JAVA", "TRACE_REPRO_GO",
    "TRACE_REPRO_MVN", "TRACE_REPRO_CONFIG_DIR", "TRACE_REPRO_CACHE", "TRACE_REPRO_RUN_DIR", "TRACE_REPRO_PG_USER",
    "TRACE_REPRO_CONNECT_URL", "TRACE_REPRO_PACKAGE", "TRACE_REPRO_CONTRACT", "TRACE_REPRO_TESTS",
    "TRACE_REPRO_PYTEST_ARGS",
)  # fmt: skip
TOOL_PREFIXES = ("TRACE_REPRO_BENCH_", "TRACE_REPRO_TEST_")


def _sections(model: type[BaseModel], path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every key of ``model`` as a path, sections (pydantic models) followed into their keys."""
    for name, field in model.model_fields.items():
        annotation: Any = field.annotation
        key = (*path, name)
        yield key
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _sections(annotation, key)


def keys(model: type[BaseModel]) -> tuple[str, ...]:
    """The dotted keys of ``model`` (``kafka``, ``kafka.group_id``, ...)."""
    return tuple(".".join(k) for k in _sections(model))


def env_names(model: type[BaseModel]) -> tuple[str, ...]:
    """The environment names of ``model``'s keys (``TRACE_REPRO_KAFKA``, ``TRACE_REPRO_KAFKA__GROUP_ID``, ...) and the
    short aliases."""
    return tuple(PREFIX + "__".join(k).upper() for k in _sections(model)) + ALIASES


def closest(name: str, valid: tuple[str, ...]) -> str | None:
    """The valid name closest to ``name``, if one is close enough to be the one meant."""
    found = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    return found[0] if found else None


def unknown_env(env: Mapping[str, str], model: type[BaseModel]) -> list[tuple[str, str | None]]:
    """The ``TRACE_REPRO_*`` names in ``env`` that nothing reads, each with the closest valid setting name."""
    valid = env_names(model)
    known = set(valid) | set(TOOL_NAMES)
    return [
        (name, closest(name, valid))
        for name in sorted(env)
        if name.startswith(PREFIX) and name.upper() not in known and not name.startswith(TOOL_PREFIXES)
    ]


def unknown_keys(data: Mapping[str, Any], model: type[BaseModel]) -> list[tuple[str, str | None]]:
    """The keys of a TOML document ``data`` that ``model`` does not have (dotted), each with the closest valid key:
    in the same section first (``kafka.groupid`` -> ``kafka.group_id``), else anywhere."""
    valid = keys(model)
    out: list[tuple[str, str | None]] = []
    for key in _unknown(data, model, ""):
        section = key.rpartition(".")[0]
        near = tuple(k for k in valid if k.startswith(section + ".")) if section else ()
        out.append((key, closest(key, near) or closest(key, valid)))
    return out


def _unknown(data: Mapping[str, Any], model: type[BaseModel], path: str) -> Iterator[str]:
    for name, value in data.items():
        field = model.model_fields.get(name)
        if field is None:
            yield f"{path}{name}"
            continue
        annotation: Any = field.annotation
        if isinstance(value, dict) and isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _unknown(value, annotation, f"{path}{name}.")
