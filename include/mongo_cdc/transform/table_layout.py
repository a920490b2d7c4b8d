"""A derived table's columns (metadata columns first, then the documents' fields), how they evolve
batch by batch, and a batch's Arrow record batch.

**Evolution.** A table's columns keep their name and type forever (``mongo_cdc.transform.column_types``
has the type rules). Each batch is surveyed against them: new top-level fields become new columns
(appended, as Delta's schema merge appends them), new nested fields are added to their struct.
A top-level value that does not fit its established column (a string in a long column, a
conflict anywhere inside a struct) goes, as Extended JSON text, into a sibling string column
``<column>__fallback``, created the first time one is needed; the typed column is null in that
row. Rows whose value fits stay typed. In Spark: ``survey`` each partition, ``BatchTypes.merge``
the surveys, ``evolved`` once on the driver, then ``record_batch`` each partition with that layout.

**Names.** Field names are used as-is: Arrow, Parquet and Delta accept any name (dots, spaces,
``$``, empty). The exceptions are names the table already uses: a metadata column (``__op``,
``__id``, ...), another reserved name (the changes table's ``hour`` partition), an established
column or fallback sibling. A new field or sibling with such a name gets underscores prepended
until the name is free, so every value is kept and no established column changes meaning.

With ``sanitize.field.names`` every column and nested struct field name is made a valid Avro
name, as Debezium's sanitizing does: each character other than ``A-Za-z0-9_`` becomes ``_``, a
leading digit too (``1st-price`` -> ``_st_price``). Names that are valid already keep their
name; a sanitized name that collides with another gets underscores prepended until it is free,
so both values are kept. Only the derived tables are renamed: the raw zone's ``after`` and the
state's document keep the document's own names, as Debezium's ``after`` JSON does. Each renamed
field records the document's name in its ``mongo_cdc.field`` metadata, so a later batch maps
its fields to the same columns.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from typing import NamedTuple

import pyarrow as pa

from mongo_cdc.transform import arrow_columns, column_survey, column_types

FALLBACK_SUFFIX = "__fallback"
FALLBACK_OF_METADATA = b"mongo_cdc.fallback_of"


class DocumentColumn(NamedTuple):
    column: str  # the column's name in the table
    field: str  # the document's top-level field it holds
    field_type: column_types.ColumnType  # its type, nested fields under the document's names
    column_type: column_types.ColumnType  # the same type, nested fields under their column names
    fallback: bool = False  # the sibling holding the field's values that do not fit its column


class TableLayout:
    def __init__(
        self,
        metadata_columns: Sequence[tuple[str, column_types.ColumnType]],
        reserved_names: Iterable[str] = (),
        sanitize_field_names: bool = False,
        document_columns: Iterable[DocumentColumn] = (),
    ) -> None:
        """A table with ``metadata_columns`` and ``document_columns`` (none: a new table)."""
        self.metadata_columns = tuple(metadata_columns)
        self.reserved_names = frozenset(reserved_names)
        self.sanitize_field_names = sanitize_field_names
        self.document_columns = tuple(document_columns)
        self.typed_columns = {c.field: c for c in self.document_columns if not c.fallback}
        self.fallback_columns = {c.field: c for c in self.document_columns if c.fallback}
        orphans = set(self.fallback_columns) - set(self.typed_columns)
        if orphans:
            raise ValueError(f"fallback columns without their typed column: {sorted(orphans)}")
        self.schema = pa.schema(
            [arrow_columns.arrow_field(name, column_type) for name, column_type in self.metadata_columns]
            + [_arrow_field(column) for column in self.document_columns]
        )

    @classmethod
    def from_arrow(
        cls,
        schema: pa.Schema,
        metadata_columns: Sequence[tuple[str, column_types.ColumnType]],
        reserved_names: Iterable[str] = (),
        sanitize_field_names: bool = False,
    ) -> TableLayout:
        """The layout of a table written with ``schema`` (ValueError if mongo-cdc did not write it).

        Columns named like a metadata column or a reserved name are not the documents' (the
        caller adds them); every other column must carry mongo-cdc's type metadata.
        """
        skipped = {name for name, _ in metadata_columns} | set(reserved_names)
        read = arrow_columns.fields_from_arrow(field for field in schema if field.name not in skipped)
        document_columns = [
            DocumentColumn(
                c.column, c.metadata[FALLBACK_OF_METADATA].decode(), c.field_type, c.column_type, True
            )
            if FALLBACK_OF_METADATA in c.metadata
            else DocumentColumn(c.column, c.field, c.field_type, c.column_type)
            for c in read
        ]
        return cls(metadata_columns, reserved_names, sanitize_field_names, document_columns)

    @property
    def stored_fields(self) -> column_types.StructFields:
        """The typed columns' fields, under the document's names."""
        return tuple((c.field, c.field_type) for c in self.typed_columns.values())

    def survey(self, documents: list[dict] | column_survey.FieldValues) -> column_survey.BatchTypes:
        """What ``documents`` need from this layout (``column_survey.survey``)."""
        return column_survey.survey(self.stored_fields, documents)

    def evolved(self, batch: column_survey.BatchTypes) -> TableLayout:
        """This layout with ``batch``'s additions and the fallback siblings its conflicts need."""
        if batch == column_survey.NO_CHANGES:
            return self
        added = dict(batch.additions[1]) if batch.additions != column_types.NULL else {}
        name_nested = partial(_free_names, sanitize=self.sanitize_field_names)
        document_columns = []
        for column in self.document_columns:
            if not column.fallback and column.field in added:
                field_type, column_type = column_types.widen(
                    column.field_type, column.column_type, added.pop(column.field), name_nested
                )
                column = column._replace(field_type=field_type, column_type=column_type)
            document_columns.append(column)
        taken = (
            {name for name, _ in self.metadata_columns}
            | self.reserved_names
            | {column.column for column in document_columns}
        )
        new = [
            (name, t)
            for name, t in column_types.struct_type(added.items())[1]
            if column_types.without_nulls(t) != column_types.NULL
        ]
        names = _free_names([name for name, _ in new], taken, self.sanitize_field_names)
        for (name, added_type), column_name in zip(new, names, strict=True):
            field_type, column_type = column_types.widen(None, None, added_type, name_nested)
            document_columns.append(DocumentColumn(column_name, name, field_type, column_type))
            taken.add(column_name)
        typed = {column.field: column for column in document_columns if not column.fallback}
        for name in sorted(batch.conflicts - set(self.fallback_columns)):
            if name not in typed:
                raise ValueError(
                    f"field {name!r} conflicts with a column this layout does not have: "
                    "the batch was surveyed against another layout"
                )
            [sibling] = _free_names([typed[name].column + FALLBACK_SUFFIX], taken, self.sanitize_field_names)
            document_columns.append(
                DocumentColumn(sibling, name, column_types.FALLBACK, column_types.FALLBACK, True)
            )
            taken.add(sibling)
        return TableLayout(
            self.metadata_columns, self.reserved_names, self.sanitize_field_names, document_columns
        )

    def reads_as(self, batch: column_survey.BatchTypes, target: TableLayout) -> bool:
        """Whether documents surveyed as ``batch`` and written in ``evolved(batch)`` read as they
        would written in ``target`` (this layout evolved with ``batch`` and others'): ``fits_in``,
        and no value left null for want of a column ``target`` has (``column_types.lost_in``)."""
        targeted = (column_types.STRUCT, target.stored_fields)
        return self.evolved(batch).fits_in(target) and not column_types.lost_in(batch.additions, targeted)

    def fits_in(self, target: TableLayout) -> bool:
        """Whether rows written in this layout read as rows of ``target``, a layout evolved from the
        same one (``widened``): each column is ``target``'s column of the same field, under the same
        name, with the same type or without some nested struct fields (``column_types.embeds``)."""
        columns = {(c.field, c.fallback): c for c in target.document_columns}
        for column in self.document_columns:
            other = columns.get((column.field, column.fallback))
            if other is None or other.column != column.column:
                return False
            if not column_types.embeds(
                column.field_type, column.column_type, other.field_type, other.column_type
            ):
                return False
        return self.metadata_columns == target.metadata_columns

    def record_batch(
        self, metadata_arrays: Mapping[str, pa.Array], documents: list[dict] | column_survey.FieldValues
    ) -> pa.RecordBatch:
        """The rows of ``documents`` (each with its metadata values, ``metadata_arrays`` keyed by
        metadata column) in this layout, which must hold them: ``evolved(survey(documents))``."""
        values_of = column_survey.FieldValues(documents) if isinstance(documents, list) else documents
        count = len(values_of)
        arrays = []
        for field in list(self.schema)[: len(self.metadata_columns)]:
            if field.name not in metadata_arrays:
                raise ValueError(f"no values for metadata column {field.name!r}")
            array = metadata_arrays[field.name]
            if len(array) != count:
                raise ValueError(
                    f"metadata column {field.name!r} has {len(array)} values for {count} documents"
                )
            arrays.append(array if array.type == field.type else array.cast(field.type))
        self._check_fields(values_of)
        document_fields = list(self.schema)[len(self.metadata_columns) :]
        # a field with a fallback sibling: (its typed values, the texts of those that do not fit)
        split = {
            column.field: values_of.split(column.field, column.field_type, field.type)
            for column, field in zip(self.document_columns, document_fields, strict=True)
            if not column.fallback and column.field in self.fallback_columns
        }
        for column, field in zip(self.document_columns, document_fields, strict=True):
            if column.fallback:
                arrays.append(split[column.field][1])
            elif column.field in split:
                arrays.append(split[column.field][0])
            else:
                arrays.append(values_of.arrow(column.field, column.field_type, field.type))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def _check_fields(self, values_of: column_survey.FieldValues) -> None:
        """Refuse documents with a typed field this layout has no column for (not surveyed)."""
        for name in values_of.names - set(self.typed_columns):
            if values_of.typed(name):
                raise ValueError(
                    f"documents have a field {name!r} this table layout has no column for: "
                    "build the layout with evolved(survey(documents)) first"
                )


def documents_to_batch(
    layout: TableLayout, metadata_arrays: Mapping[str, pa.Array], documents: list[dict]
) -> tuple[TableLayout, pa.RecordBatch]:
    """``documents`` as one record batch, and the layout evolved to hold them (in one process)."""
    values_of = column_survey.FieldValues(documents)
    layout = layout.evolved(layout.survey(values_of))
    return layout, layout.record_batch(metadata_arrays, values_of)


def widened(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """``rows``, written in a layout that ``fits_in`` the one of ``schema``, as rows of ``schema``:
    the columns and nested fields they lack are null."""
    arrays = [
        rows.column(field.name).cast(field.type)
        if field.name in rows.column_names
        else pa.nulls(rows.num_rows, field.type)
        for field in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def _arrow_field(column: DocumentColumn) -> pa.Field:
    if not column.fallback:
        return arrow_columns.arrow_field(column.column, column.column_type, column.field, column.field_type)
    field = arrow_columns.arrow_field(column.column, column_types.FALLBACK)
    return field.with_metadata({**field.metadata, FALLBACK_OF_METADATA: column.field.encode()})


def avro_name(name: str) -> str:
    """``name`` as a valid Avro name, the way Debezium's ``sanitize.field.names`` makes it."""
    sanitized = _NOT_AVRO.sub("_", name)
    return "_" + sanitized[1:] if sanitized[:1].isdigit() else sanitized or "_"


_NOT_AVRO = re.compile(r"[^A-Za-z0-9_]")


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
