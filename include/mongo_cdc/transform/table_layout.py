"""Columns of a derived table (metadata columns first, then the document's fields) and its rows.

Field names are used as-is: Spark and Parquet accept any name (dots, spaces, ``$``, empty).
The one exception is a top-level field whose name the table needs: a metadata column (``__op``,
``__id``, ...) or another reserved name (the changes table's ``hour`` partition). It gets
underscores prepended until the name is free, so both values are kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from mongo_cdc.transform import ejson_types as types


class TableLayout:
    def __init__(
        self,
        metadata_columns: Sequence[tuple[str, types.ColumnType]],
        document_type: types.ColumnType,
        reserved_names: Iterable[str] = (),
    ) -> None:
        """``document_type`` is the merged ``type_of_document`` of every row's document (or NULL)."""
        self.metadata_columns = tuple(metadata_columns)
        self.document_fields: types.StructFields = document_type[1] if document_type != types.NULL else ()
        field_names = [name for name, _ in self.document_fields]
        reserved = {name for name, _ in self.metadata_columns} | set(reserved_names)
        self.document_columns = _free_names(field_names, reserved)

    @property
    def table_type(self) -> types.ColumnType:
        """The whole row as a struct type, columns in table order."""
        document_columns = zip(self.document_columns, (t for _, t in self.document_fields), strict=True)
        return (types.STRUCT, self.metadata_columns + tuple(document_columns))

    def row(self, metadata_values: tuple, document: dict[str, Any]) -> tuple:
        return metadata_values + types.to_column_value(document, (types.STRUCT, self.document_fields))


def _free_names(field_names: list[str], reserved: set[str]) -> tuple[str, ...]:
    taken = set(field_names) | reserved
    columns = []
    for name in field_names:
        column = name
        if name in reserved:
            while column in taken:
                column = "_" + column
            taken.add(column)
        columns.append(column)
    return tuple(columns)
