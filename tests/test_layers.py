"""The import layers: checked by import-linter in `make lint`; these tests keep its configuration complete."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contracts: list[dict[str, object]] = config["contracts"]
    return contracts


def test_every_package_is_split_into_rooms_by_an_exhaustive_layers_contract() -> None:
    """processors/, sinks/ and streamer/ each have a layers contract naming every one of their children (import-linter
    then fails on a new folder no layer names), and the vocabulary is processors/' bottom layer."""
    by_container = {
        c["containers"][0]: c  # type: ignore[index]
        for c in _contracts()
        if c.get("type") == "layers" and c.get("containers")
    }
    for package in ("processors", "sinks", "streamer"):
        assert package in by_container, f"no layers contract for {package}/"
        assert by_container[package].get("exhaustive") is True, f"{package}/'s layers contract is not exhaustive"
    assert by_container["processors"]["layers"][-1] == "model"  # type: ignore[index]
    [vocabulary] = [c for c in _contracts() if c.get("source_modules") == ["processors.model"]]
    assert {"streamer", "sinks"} <= set(vocabulary["forbidden_modules"])  # type: ignore[arg-type]


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
