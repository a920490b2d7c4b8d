"""One declaration per source key, Debezium's ``Field`` style, written on the ``SourceConfig`` field.

``setting(key, default, value_type, description)`` is a ``dataclasses.field`` whose metadata holds
a ``Setting``: the YAML key, the value type that parses it (and says what it allows) and the
description of the configuration reference page. Loading, the unknown-key hints and the page all
read these declarations (``declared_settings``), so a key is declared in one place.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

from mongo_cdc.config.values import ValueType

_METADATA_KEY = "mongo_cdc.setting"


@dataclass(frozen=True)
class Setting:
    key: str
    attribute: str  # the dataclass field
    default: Any  # dataclasses.MISSING when the key is required
    value_type: ValueType
    description: str  # Markdown: one cell of the reference page's table
    shown_default: str | None  # the page's default, when the value alone would not say it
    required_because: str | None

    @property
    def required(self) -> bool:
        return self.default is MISSING


@dataclass(frozen=True)
class _Declaration:
    key: str
    value_type: ValueType
    description: str
    shown_default: str | None = None
    required_because: str | None = None


def setting(
    key: str, default: Any, value_type: ValueType, description: str, *, shown_default: str | None = None
) -> Any:
    """A dataclass field read from ``key``: ``default`` when the YAML leaves it out."""
    declaration = _Declaration(key, value_type, description, shown_default)
    return field(default=default, metadata={_METADATA_KEY: declaration})


def required_setting(key: str, value_type: ValueType, description: str, *, because: str) -> Any:
    """A dataclass field read from ``key``, which every YAML file must give (``because`` says why)."""
    declaration = _Declaration(key, value_type, description, required_because=because)
    return field(metadata={_METADATA_KEY: declaration})


def declared_settings(cls: type) -> Iterator[Setting]:
    """The settings declared on the dataclass ``cls``, in field order."""
    for cls_field in fields(cls):
        if _METADATA_KEY in cls_field.metadata:
            yield _setting(cls_field)


def _setting(cls_field: Field) -> Setting:
    declaration: _Declaration = cls_field.metadata[_METADATA_KEY]
    return Setting(
        key=declaration.key,
        attribute=cls_field.name,
        default=cls_field.default,
        value_type=declaration.value_type,
        description=declaration.description,
        shown_default=declaration.shown_default,
        required_because=declaration.required_because,
    )
