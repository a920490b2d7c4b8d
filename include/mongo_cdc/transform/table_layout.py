"""Columns of a derived table (metadata columns first, then the document's fields) and its rows.

Field names are used as-is: Spark and Parquet accept any name (dots, spaces, ``$``, empty).
The one exception is a top-level field whose name the table needs: a metadata column (``__op``,
``__id``, ...) or another reserved name (the changes table's ``hour`` partition). It gets
underscores prepended until the name is free, so both values are kept.

With ``sanitize.field.names`` every column and nested struct field name is made a valid Avro
name, as Debezium's sanitizing does: each character other than ``A-Za-z0-9_`` becomes ``_``, a
leading digit too (``1st-price`` -> ``_st_price``). Names that are valid already keep their
name; a sanitized name that collides with another gets underscores prepended until it is free,
so both values are kept. Only the derived tables are renamed: the raw zone's ``after`` and the
state's ``__doc`` keep the document's own names, as Debezium's ``after`` JSON does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from mongo_cdc.transform import ejson_types as types


class TableLayout:
    def __init__(
        self,
        metadata_columns: Sequence[tuple[str, types.ColumnType]],
        document_type: types.ColumnType,
        reserved_names: Iterable[str] = (),
        sanitize_field_names: bool = False,
    ) -> None:
        """``document_type`` is the merged ``type_of_document`` of every row's document (or NULL)."""
        self.metadata_columns = tuple(metadata_columns)
        self.document_fields: types.StructFields = document_type[1] if document_type != types.NULL else ()
        field_names = [name for name, _ in self.document_fields]
        reserved = {name for name, _ in self.metadata_columns} | set(reserved_names)
        self.document_columns = _free_names(field_names, reserved, sanitize_field_names)
        # values are built with the documents' own names (to_column_value), the schema carries these
        self.column_types = tuple(
            _sanitized(field_type) if sanitize_field_names else field_type
            for _, field_type in self.document_fields
        )

    @property
    def table_type(self) -> types.ColumnType:
        """The whole row as a struct type, columns in table order."""
        document_columns = zip(self.document_columns, self.column_types, strict=True)
        return (types.STRUCT, self.metadata_columns + tuple(document_columns))

    def row(self, metadata_values: tuple, document: dict[str, Any]) -> tuple:
        return metadata_values + types.to_column_value(document, (types.STRUCT, self.document_fields))


def avro_name(name: str) -> str:
    """``name`` as a valid Avro name, the way Debezium's ``sanitize.field.names`` makes it."""
    sanitized = _NOT_AVRO.sub("_", name)
    return "_" + sanitized[1:] if sanitized[:1].isdigit() else sanitized or "_"


_NOT_AVRO = re.compile(r"[^A-Za-z0-9_]")


def _sanitized(column_type: types.ColumnType) -> types.ColumnType:
    """A type with every nested struct field name sanitized (see the module docstring)."""
    if not isinstance(column_type, tuple):
        return column_type
    kind, inner = column_type
    if kind == types.ARRAY:
        return (kind, _sanitized(inner))
    names = _free_names([name for name, _ in inner], set(), sanitize=True)
    fields = zip(names, (field_type for _, field_type in inner), strict=True)
    return (kind, tuple((name, _sanitized(field_type)) for name, field_type in fields))


def _free_names(field_names: list[str], reserved: set[str], sanitize: bool) -> tuple[str, ...]:
    """Column names for ``field_names``: a name that is reserved, or that sanitizing changes, moves
    aside (underscores prepended) from every reserved, kept or already given name."""
    wanted = [avro_name(name) if sanitize else name for name in field_names]
    taken = {name for name, column in zip(field_names, wanted, strict=True) if column == name} | reserved
    columns = []
    for name, column in zip(field_names, wanted, strict=True):
        if column != name or name in reserved:
            while column in taken:
                column = "_" + column
            taken.add(column)
        columns.append(column)
    return tuple(columns)
