"""Source keys are declared once, on SourceConfig's fields, and the reference page is rendered from them."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from mongo_cdc.config import SETTINGS, SourceConfig, SourceConfigError, load_source
from mongo_cdc.config.dag_settings import DAG_SETTINGS, DagSettings
from mongo_cdc.config.reference import EXAMPLE_SOURCE, REGENERATE, render
from mongo_cdc.config.setting import Setting
from mongo_cdc.config.values import Integer

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "configuration.md"


def value_of(config: SourceConfig, declared: Setting) -> object:
    """The loaded value of a key: a ``dag.*`` one is on ``config.dag``."""
    return getattr(config.dag if declared.key in DAG_SETTINGS else config, declared.attribute)


def test_the_configuration_page_is_the_rendered_declarations():
    assert PAGE.is_file(), f"{PAGE} is missing; run `{REGENERATE}`"
    assert PAGE.read_text(encoding="utf-8") == render(), (
        f"docs/configuration.md differs from the declarations it is rendered from; run `{REGENERATE}`"
    )


def test_every_source_field_is_a_declared_key_with_a_description():
    # name, path and dag are not keys; the field.hash.list key comes from a connection, never the file
    not_keys = ("name", "path", "dag", "field_hash_key")
    settings_fields = [f for f in fields(SourceConfig) if f.name not in not_keys]
    settings_fields += fields(DagSettings)
    undeclared = [f.name for f in settings_fields if f.name not in {s.attribute for s in SETTINGS.values()}]
    assert undeclared == []
    assert len(SETTINGS) == len(settings_fields)
    for declared in SETTINGS.values():
        assert re.fullmatch(r"[a-z]+(\.[a-z]+)+", declared.key), declared.key
        assert declared.description.strip(), f"{declared.key} has no description"
        assert f"| `{declared.key}` |" in render()


@pytest.mark.parametrize(
    "declared", [s for s in SETTINGS.values() if isinstance(s.value_type, Integer)], ids=lambda s: s.key
)
def test_an_integer_key_refuses_what_its_page_row_does_not_allow(tmp_path, declared):
    bound = declared.value_type
    row = next(line for line in render().splitlines() if line.startswith(f"| `{declared.key}` |"))
    assert f"| {bound.low}–{bound.high} |" in row
    for refused in (bound.low - 1, bound.high + 1):
        path = tmp_path / "source.yaml"
        path.write_text(f"topic.prefix: p\n{declared.key}: {refused}\n")
        with pytest.raises(SourceConfigError, match=f"from {bound.low} to {bound.high}, got {refused}"):
            load_source(path)
    backoff_max = SETTINGS["connect.backoff.max.delay.ms"]  # may not be below the initial delay
    accepted = {"topic.prefix": "p", backoff_max.key: backoff_max.value_type.high, declared.key: bound.high}
    path.write_text(yaml.safe_dump(accepted))
    assert value_of(load_source(path), declared) == bound.high


def test_a_left_out_key_takes_its_declared_default(tmp_path):
    path = tmp_path / "source.yaml"
    path.write_text("topic.prefix: p\n")
    config = load_source(path)
    for declared in SETTINGS.values():
        if declared.key not in ("topic.prefix", "lake.root"):  # lake.root: resolved by load_source
            assert value_of(config, declared) == declared.default, declared.key


def test_the_page_example_is_the_demo_source_and_loads():
    config = load_source(EXAMPLE_SOURCE)
    assert (config.topic_prefix, config.snapshot_max_threads) == ("dbserver1", 2)
    assert f"```yaml\n{EXAMPLE_SOURCE.read_text(encoding='utf-8')}```" in render()
