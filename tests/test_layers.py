"""The import layers: checked by import-linter in `make lint`; these tests keep its configuration complete."""

from __future__ import annotations

import pkgutil
import tomllib
from pathlib import Path

import processors

ROOT = Path(__file__).resolve().parent.parent


def _contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contracts: list[dict[str, object]] = config["contracts"]
    return contracts


def test_the_vocabulary_is_forbidden_every_other_processors_module() -> None:
    """A new folder under processors/ must join the list the vocabulary may not import (else it could)."""
    [contract] = [c for c in _contracts() if c.get("source_modules") == ["processors.model"]]
    forbidden = set(contract["forbidden_modules"])  # type: ignore[arg-type]
    children = {f"processors.{m.name}" for m in pkgutil.iter_modules(processors.__path__)} - {"processors.model"}
    assert children <= forbidden, f"add to the contract: {sorted(children - forbidden)}"
    assert {"streamer", "sinks"} <= forbidden


def test_make_lint_runs_import_linter() -> None:
    """`make lint` (and so `make test`) runs lint-imports."""
    lint = (ROOT / "Makefile").read_text().split("\nlint:", 1)[1].split("\n\n", 1)[0]
    assert "lint-imports" in lint


def test_no_product_module_grows_past_about_four_hundred_lines() -> None:
    """Modules stay small and named for what they hold (STYLE.md): none of streamer/, processors/, sinks/ over 420."""
    big = {
        str(p.relative_to(ROOT)): n
        for package in ("streamer", "processors", "sinks")
        for p in (ROOT / package).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 420
    }
    assert not big, big
