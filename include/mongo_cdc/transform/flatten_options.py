"""The changes table's event-flattening options: Debezium ExtractNewDocumentState's option set.

``mongo_cdc.config`` reads them from the source YAML (same key names as the SMT),
``plan_transform`` hands them to the Spark job as ``spark_arguments()`` (``--flattening`` and the
options as JSON, keyed like the YAML), which reads them back with ``from_json``;
``mongo_cdc.transform.flatten`` applies them.
Light on imports on purpose: the DAG file imports this when it is parsed.

``add.fields`` names resolve like Debezium's: ``op`` and ``ts_ms`` are the event's own fields,
any other bare name is a ``source`` field (``rs`` is ``source.rs``). The column is the prefix
plus the name as written, with ``_`` for the dot (``source.rs`` -> ``__source_rs``,
``rs`` -> ``__rs``), or the prefix plus the new name of a ``name:newName`` entry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, NamedTuple

import pyarrow as pa

from mongo_cdc import lake
from mongo_cdc.transform import column_types

if TYPE_CHECKING:
    from deltalake import DeltaTable

# Where the changes table records the flattening options it was written with.
FLATTENING_METADATA = "mongo_cdc.flattening"

ARRAY_ENCODINGS = ("array", "document")
DELETE_TOMBSTONE_HANDLING_MODES = ("drop", "tombstone", "rewrite", "rewrite-with-tombstone")

# Event fields add.fields can name, typed as in the raw events (mongo_cdc.lake.RAW_SCHEMA).
EVENT_FIELDS: dict[str, column_types.ColumnType] = {
    "op": column_types.STRING,
    "ts_ms": column_types.LONG,
    "source.version": column_types.STRING,
    "source.connector": column_types.STRING,
    "source.name": column_types.STRING,
    "source.ts_ms": column_types.LONG,
    "source.snapshot": column_types.BOOL,
    "source.db": column_types.STRING,
    "source.rs": column_types.STRING,
    "source.collection": column_types.STRING,
    "source.ord": column_types.INT,
    "source.lsid": column_types.STRING,
    "source.txnNumber": column_types.LONG,
    "source.sequence": column_types.STRING,
    "source.ts_us": column_types.LONG,
    "source.ts_ns": column_types.LONG,
    "source.wallTime": column_types.LONG,
}
_TOP_LEVEL_FIELDS = ("op", "ts_ms")

# Every changes table has these after the added fields, whatever the options.
FIXED_COLUMNS: tuple[tuple[str, column_types.ColumnType], ...] = (
    ("__deleted", column_types.BOOL),
    ("__cluster_time", column_types.LONG),
    ("__event_order", column_types.STRING),
)
# The Spark job's hour partition and staging columns: an added field may not take them either.
_RESERVED_NAMES = ("hour", "__raw_file")


class AddedField(NamedTuple):
    path: tuple[str, ...]  # ("op",) or ("source", "rs")
    column: str
    column_type: column_types.ColumnType


def added_field(spec: str, prefix: str) -> AddedField:
    """One ``add.fields`` entry (``name`` or ``name:newName``) resolved; ValueError if unknown."""
    name, separator, new_name = spec.partition(":")
    qualified = name if name in _TOP_LEVEL_FIELDS or "." in name else f"source.{name}"
    if qualified not in EVENT_FIELDS or (separator and not new_name) or "," in spec or ":" in new_name:
        source_fields = ", ".join(field.removeprefix("source.") for field in EVENT_FIELDS if "." in field)
        raise ValueError(
            f"key 'add.fields' has {spec!r}; allowed: op, ts_ms, source.<field> or <field> for the "
            f"source fields {source_fields}, each optionally followed by ':<new name>'"
        )
    column = prefix + (new_name or name.replace(".", "_"))
    return AddedField(tuple(qualified.split(".")), column, EVENT_FIELDS[qualified])


@dataclass(frozen=True)
class FlatteningOptions:
    """Defaults as Debezium's, except two that keep the table as it always was: rewritten deletes
    (Debezium's documentation names no single default) and ``__op`` / ``__source_ts_ms`` added
    (Debezium adds none)."""

    array_encoding: str = "array"
    flatten_struct: bool = False
    flatten_struct_delimiter: str = "_"
    delete_tombstone_handling_mode: str = "rewrite"
    add_fields: tuple[str, ...] = ("op", "source.ts_ms")
    add_fields_prefix: str = "__"
    # Avro-safe column names in the changes and state tables (mongo_cdc.transform.table_layout)
    sanitize_field_names: bool = False

    def __post_init__(self) -> None:
        for key, allowed in (
            ("array.encoding", ARRAY_ENCODINGS),
            ("delete.tombstone.handling.mode", DELETE_TOMBSTONE_HANDLING_MODES),
        ):
            value = getattr(self, _ATTRIBUTES[key])
            if value not in allowed:
                raise ValueError(f"key '{key}' is {value!r}; allowed values: {', '.join(allowed)}")
        if not self.flatten_struct_delimiter:
            raise ValueError("key 'flatten.struct.delimiter' must not be empty")
        taken = {name for name, _ in FIXED_COLUMNS} | set(_RESERVED_NAMES)
        for field in self.added_fields:
            if field.column in taken:
                raise ValueError(
                    f"key 'add.fields' gives column {field.column!r} (with 'add.fields.prefix' "
                    f"{self.add_fields_prefix!r}), a name already taken; rename the entry ('name:newName')"
                )
            taken.add(field.column)

    @cached_property
    def added_fields(self) -> tuple[AddedField, ...]:
        return tuple(added_field(spec, self.add_fields_prefix) for spec in self.add_fields)

    @property
    def metadata_columns(self) -> tuple[tuple[str, column_types.ColumnType], ...]:
        """The changes table's leading columns: the added fields, then ``FIXED_COLUMNS``."""
        return tuple((field.column, field.column_type) for field in self.added_fields) + FIXED_COLUMNS

    def to_json(self) -> dict[str, Any]:
        """The options keyed by their YAML keys: the Spark job's ``--flattening`` argument, and what a
        changes version records it was written with."""
        by_key = {key: getattr(self, attribute) for key, attribute in _ATTRIBUTES.items()}
        return {**by_key, "add.fields": list(self.add_fields)}

    @classmethod
    def from_json(cls, data: Any) -> FlatteningOptions:
        """Inverse of ``to_json``; a missing key keeps its default. ValueError if anything is off."""
        if not isinstance(data, dict) or set(data) - set(_ATTRIBUTES):
            raise ValueError(f"expected an object with some of the keys {', '.join(_ATTRIBUTES)}")
        for key, value in data.items():
            if key == "add.fields":
                value_ok = isinstance(value, list) and all(isinstance(item, str) for item in value)
            else:
                value_ok = isinstance(value, type(getattr(_DEFAULTS, _ATTRIBUTES[key])))
            if not value_ok:
                raise ValueError(f"key '{key}' has {value!r} of the wrong type")
        return cls(**{_ATTRIBUTES[key]: tuple(v) if key == "add.fields" else v for key, v in data.items()})

    def spark_arguments(self) -> list[str]:
        """The arguments that hand these options to ``cdc_transform``."""
        return ["--flattening", json.dumps(self.to_json(), sort_keys=True)]


# YAML key -> FlatteningOptions attribute
_ATTRIBUTES = {
    "array.encoding": "array_encoding",
    "flatten.struct": "flatten_struct",
    "flatten.struct.delimiter": "flatten_struct_delimiter",
    "delete.tombstone.handling.mode": "delete_tombstone_handling_mode",
    "add.fields": "add_fields",
    "add.fields.prefix": "add_fields_prefix",
    "sanitize.field.names": "sanitize_field_names",
}
_DEFAULTS = FlatteningOptions()


def with_recorded_flattening(schema: pa.Schema, options: FlatteningOptions) -> pa.Schema:
    """``schema`` with ``options`` recorded on its hour column (``FLATTENING_METADATA``)."""
    index = schema.get_field_index(lake.HOUR_COLUMN)
    field = schema.field(index).with_metadata(
        {FLATTENING_METADATA: json.dumps(options.to_json(), sort_keys=True)}
    )
    return schema.set(index, field)


def recorded_flattening(table: DeltaTable) -> dict[str, Any]:
    """The flattening options the changes table was written with (defaults where none are recorded)."""
    field = pa.schema(table.schema().to_arrow()).field(lake.HOUR_COLUMN)
    recorded = (field.metadata or {}).get(FLATTENING_METADATA.encode())
    return json.loads(recorded) if recorded else FlatteningOptions().to_json()
