"""The configuration reference (docs/configuration.md) is generated from the settings model and kept in step with
it; the shipped example configuration is generic and names every section; the demo has its own."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field

from processors.api.component import Section
from processors.detectors.collisions.config import CollisionConfig
from streamer import config
from streamer.config_reference import reference, undocumented

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "docs" / "configuration.md"


def test_every_setting_has_a_description() -> None:
    """Every key of every section (component sections included) says what it is for."""
    assert undocumented(config.settings_model()) == []


def test_an_undocumented_setting_is_reported() -> None:
    """A key without a description, and a section without a docstring, are named by their dotted path."""

    class Documented(Section):
        """A section."""

        size: int = Field(1, description="how many")
        colour: str = "red"

    class Bare(Section):
        pass

    class Model(Section):
        """Top."""

        first: Documented = Documented()
        second: Bare = Bare()

    assert undocumented(Model) == ["first.colour", "second (section docstring)"]


def test_the_committed_reference_is_up_to_date() -> None:
    """docs/configuration.md is exactly what ``trace-repro config reference`` prints for the current model."""
    assert REFERENCE.read_text() == reference(), (
        "docs/configuration.md is out of date: run `trace-repro config reference --output docs/configuration.md`"
    )


def test_the_reference_lists_every_key_with_its_environment_name() -> None:
    """Each key of the model appears in its section's table with its TRACE_REPRO_* name."""
    text = reference()
    for dotted in ("kafka.cdc_pattern", "decode.schema_registry.max_schemas", "collisions.invariants", "gitlab.url"):
        *section, key = dotted.split(".")
        env = "TRACE_REPRO_" + "__".join(dotted.split(".")).upper()
        block = text.split(f"## `[{'.'.join(section)}]`", 1)[1].split("\n## ", 1)[0]
        assert re.search(rf"^\| `{key}` \|.*`{env}`", block, re.M), dotted


def test_the_shipped_config_is_generic_and_names_every_section() -> None:
    """config/trace-repro.toml loads, carries no demo topic or business rule, and shows every section (as a header,
    commented or not) so a reader sees where each setting goes; config/demo.toml is the shop's."""
    shipped = REPO / "config" / "trace-repro.toml"
    settings = config.load(shipped, env={})
    assert not re.match(settings.kafka.cdc_pattern, "shop.public.orders")
    assert settings.section("collisions", CollisionConfig).invariants == {}
    headers = set(re.findall(r"^#? ?\[([a-z_.]+)\]", shipped.read_text(), re.M))
    sections = {k for k, f in config.settings_model().model_fields.items() if isinstance(f.default, Section)}
    assert sections - headers == set()
    demo = config.load(REPO / "config" / "demo.toml", env={})
    assert re.match(demo.kafka.cdc_pattern, "shop.public.orders")
    assert demo.section("collisions", CollisionConfig).invariants == {"inventory": ["stock >= 0"]}
