"""The Arrow form of column types (``column_types``): fields, their metadata, values as arrays.

**Arrow form.** Each Arrow field carries ``{"mongo_cdc.type": <JSON of its type>}`` where a
nested struct is written ``"struct"`` (its own fields carry their own), e.g. ``"objectId"`` or
``["array", "struct"]``: Delta keeps field metadata but has no field for list elements. A field
whose column name differs from the document's field name (``sanitize.field.names``) also
carries ``{"mongo_cdc.field": <the document's name>}``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from functools import cache
from typing import Any, NamedTuple

import pyarrow as pa

from mongo_cdc import extjson
from mongo_cdc.transform import column_types

TYPE_METADATA = b"mongo_cdc.type"
FIELD_METADATA = b"mongo_cdc.field"

_ARROW_SCALARS = {
    column_types.INT: pa.int32(),
    column_types.LONG: pa.int64(),
    column_types.DOUBLE: pa.float64(),
    column_types.BOOL: pa.bool_(),
    column_types.STRING: pa.string(),
    column_types.OBJECT_ID: pa.string(),
    column_types.DATE: pa.timestamp("us", tz="UTC"),
    column_types.DECIMAL: pa.string(),
    column_types.BINARY: pa.binary(),
    column_types.FALLBACK: pa.string(),
}
LIST_ELEMENT = "element"  # the name Delta (delta-rs) gives list elements


def arrow_type(column: column_types.ColumnType, fields: column_types.ColumnType | None = None) -> pa.DataType:
    """The Arrow type of ``column`` (a type under column names), its fields carrying their
    metadata; ``fields`` is the same type under the document's names where they differ."""
    if not isinstance(column, tuple):
        if column not in _ARROW_SCALARS:
            raise ValueError(f"no Arrow type for {column!r}: a null-typed field has no column")
        return _ARROW_SCALARS[column]
    kind, inner = column
    if kind == column_types.ARRAY:
        element = arrow_type(inner, None if fields is None else fields[1])
        return pa.list_(pa.field(LIST_ELEMENT, element))
    sources = inner if fields is None else fields[1]
    return pa.struct(
        [
            arrow_field(name, field_type, field_name, field_source)
            for (name, field_type), (field_name, field_source) in zip(inner, sources, strict=True)
        ]
    )


def arrow_field(
    name: str,
    column: column_types.ColumnType,
    field_name: str | None = None,
    fields: column_types.ColumnType | None = None,
) -> pa.Field:
    """An Arrow field for a column of type ``column``, with the ``mongo_cdc.type`` metadata (and
    ``mongo_cdc.field`` when the document's ``field_name`` differs from ``name``)."""
    metadata = {TYPE_METADATA: json.dumps(_level_type(column), separators=(",", ":")).encode()}
    if field_name is not None and field_name != name:
        metadata[FIELD_METADATA] = field_name.encode()
    return pa.field(name, arrow_type(column, fields), metadata=metadata)


def _level_type(column: column_types.ColumnType) -> Any:
    """``column`` as JSON with nested structs written as just ``"struct"``."""
    if not isinstance(column, tuple):
        return column
    kind, inner = column
    return column_types.STRUCT if kind == column_types.STRUCT else [column_types.ARRAY, _level_type(inner)]


class ArrowColumn(NamedTuple):
    """One Arrow field read back: its name and type, and the document's name and type."""

    column: str
    column_type: column_types.ColumnType  # nested fields under their column names
    field: str
    field_type: column_types.ColumnType  # nested fields under the document's names
    metadata: dict[bytes, bytes]


def fields_from_arrow(arrow: pa.Schema | pa.StructType | Iterable[pa.Field]) -> tuple[ArrowColumn, ...]:
    """The fields of an Arrow schema or struct, typed from their ``mongo_cdc.type`` metadata.

    ValueError naming the field if one lacks it: the table was not written by mongo-cdc.
    """
    return tuple(_column_from_arrow(field) for field in arrow)


def _column_from_arrow(field: pa.Field) -> ArrowColumn:
    metadata = dict(field.metadata or {})
    if TYPE_METADATA not in metadata:
        raise ValueError(
            f"column {field.name!r} has no {TYPE_METADATA.decode()} field metadata: this table was not "
            "written by mongo-cdc (or by a version before the Delta layout); rebuild it from raw"
        )
    column, source = _type_from_arrow(json.loads(metadata[TYPE_METADATA]), field.type, field.name)
    name = metadata.get(FIELD_METADATA, field.name.encode()).decode()
    return ArrowColumn(field.name, column, name, source, metadata)


def _type_from_arrow(
    level: Any, arrow: pa.DataType, where: str
) -> tuple[column_types.ColumnType, column_types.ColumnType]:
    if level == column_types.STRUCT and pa.types.is_struct(arrow):
        read = fields_from_arrow(arrow)
        return (
            (column_types.STRUCT, tuple((c.column, c.column_type) for c in read)),
            (column_types.STRUCT, tuple((c.field, c.field_type) for c in read)),
        )
    if isinstance(level, list) and level[:1] == [column_types.ARRAY] and pa.types.is_list(arrow):
        column, source = _type_from_arrow(level[1], arrow.value_type, where)
        return (column_types.ARRAY, column), (column_types.ARRAY, source)
    if isinstance(level, str) and _ARROW_SCALARS.get(level) == arrow:
        return level, level
    raise ValueError(
        f"column {where!r}: {TYPE_METADATA.decode()} {level!r} does not describe its type {arrow}"
    )


# -- values ------------------------------------------------------------------------------------


def fallback_text(value: Any) -> str:
    """A value as a fallback column holds it: its Extended JSON text."""
    return extjson.encode_str(value)


def to_arrow(values: list, column: column_types.ColumnType, arrow: pa.DataType | None = None) -> pa.Array:
    """``values`` (which fit ``column``, a type under the document's names; None is null) as an
    Arrow array of type ``arrow`` (``arrow_type(column)`` under other names: a zero-copy view)."""
    prepare = _preparer(column)
    if prepare is not None:
        values = [None if value is None else prepare(value) for value in values]
    array = pa.array(values, type=arrow_type(column))
    return array if arrow is None or arrow == array.type else array.view(arrow)


@cache  # a table has few types
def _preparer(column: column_types.ColumnType) -> Callable[[Any], Any] | None:
    """A function turning a value into one ``pa.array`` takes for ``column``; None if it takes
    the value as it is."""
    if not isinstance(column, tuple):
        return _SCALAR_PREPARERS.get(column)
    if column[0] == column_types.ARRAY:
        element = _preparer(column[1])
        return None if element is None else _array_preparer(element)
    prepared = tuple((name, p) for name, field in column[1] if (p := _preparer(field)) is not None)
    return _struct_preparer(prepared) if prepared else None


def _array_preparer(element: Callable[[Any], Any]) -> Callable[[list], list]:
    return lambda array: [None if value is None else element(value) for value in array]


def _struct_preparer(fields: tuple[tuple[str, Callable[[Any], Any]], ...]) -> Callable[[dict], dict]:
    def prepare(document: dict) -> dict:
        prepared = dict(document)
        for name, prepare_field in fields:
            value = document.get(name)
            if value is not None:
                prepared[name] = prepare_field(value)
        return prepared

    return prepare


_SCALAR_PREPARERS: dict[column_types.ColumnType, Callable[[Any], Any]] = {
    column_types.OBJECT_ID: str,
    column_types.DATE: lambda value: column_types.date_millis(value) * 1000,
    column_types.DECIMAL: str,
    column_types.FALLBACK: fallback_text,
}
