"""Lazy package exports (PEP 562): a package names what it offers without importing it until first use.

A component's heavy dependencies (libcst for the repro worker, python-gitlab and requests for the GitLab
sink; with the local engines' psycopg, made lazy too) are then loaded only by a daemon
that enables the component.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def exports(package: str, modules: Mapping[str, Iterable[str]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that imports each name from its module (``{module: names}``, as the
    package's ``TYPE_CHECKING`` imports read) on first access."""
    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # the next access is a plain attribute
        return value

    return __getattr__
