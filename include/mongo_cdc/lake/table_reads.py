"""Reading the lake's rows whatever Arrow string type their writer chose: the one owner of filtered reads.

A table's data files do not agree on how they store text and bytes. Our own writers (pyarrow) and
delta-rs appends and compaction keep the type they were given (``string``, or ``large_string``);
delta-rs MERGE, DELETE and UPDATE write ``string_view``/``binary_view`` (their DataFusion plans).
pyarrow 26 has no compute kernel across those types: a scan filter bound to the Delta schema's
``string`` fails on a rewritten file's statistics (``Function 'greater_equal' has no kernel matching
input types (string, string_view)``), and ``is_in`` has no ``string_view`` kernel at all. So no read
here lets pyarrow filter a file in its own types: rows are scanned, cast to plain types
(``plain``), and only then filtered. Files are still skipped by their Delta statistics
(``Where.files``, evaluated by delta-rs on the log, where every type is the Delta schema's).

Our writers keep plain ``string``/``binary`` (they build their arrays so); what delta-rs writes is
its choice, and every reader normalizes instead of trusting it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mongo_cdc.lake.storage import table_filesystem

if TYPE_CHECKING:  # Spark executors import this module (raw_events) and need only pyarrow
    from deltalake import DeltaTable

# delta-rs tuple filters: [(column, op, value), ...] (a conjunction), or a list of such lists (OR)
FileFilters = list[Any]
# a whole-table scan's batches (``scan_rows``), and the buffer its reads of a file go through
SCAN_BATCH_ROWS = 16_384
_SCAN_BUFFER_BYTES = 1 << 20
TEXT_TYPES = (pa.string(), pa.large_string(), pa.string_view())
BYTES_TYPES = (pa.binary(), pa.large_binary(), pa.binary_view())


@dataclass(frozen=True)
class Where:
    """Which rows a read keeps: ``expression`` over plain-typed rows, reading the top-level
    ``columns`` (None: every column); ``files`` (optional) skips data files by their statistics."""

    expression: pc.Expression
    columns: tuple[str, ...] | None
    files: FileFilters | None = None

    @classmethod
    def equal(cls, **values: Any) -> Where:
        """Rows whose ``column`` equals each given value (a conjunction)."""
        expression = pc.scalar(True)
        for column, value in values.items():
            expression = expression & (pc.field(column) == value)
        return cls(expression, tuple(values), [(column, "=", value) for column, value in values.items()])


def plain_type(data_type: pa.DataType) -> pa.DataType:
    """``data_type`` with every text type as ``string``, every bytes type as ``binary`` and every
    dictionary as its values' type, nested types included."""
    if pa.types.is_dictionary(data_type):
        return plain_type(data_type.value_type)
    if data_type in TEXT_TYPES:
        return pa.string()
    if data_type in BYTES_TYPES:
        return pa.binary()
    if pa.types.is_struct(data_type):
        return pa.struct([_plain_field(data_type.field(index)) for index in range(data_type.num_fields)])
    if pa.types.is_map(data_type):
        return pa.map_(
            _plain_field(data_type.key_field), _plain_field(data_type.item_field), data_type.keys_sorted
        )
    if pa.types.is_list(data_type) or pa.types.is_large_list(data_type) or pa.types.is_list_view(data_type):
        return pa.list_(_plain_field(data_type.value_field))
    if pa.types.is_fixed_size_list(data_type):
        return pa.list_(_plain_field(data_type.value_field), data_type.list_size)
    return data_type


def _plain_field(field: pa.Field) -> pa.Field:
    return field.with_type(plain_type(field.type))


def plain_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([_plain_field(field) for field in schema], metadata=schema.metadata)


def plain(rows: pa.Table) -> pa.Table:
    """``rows`` in plain types (``plain_type``): what every pyarrow compute call on lake data takes."""
    schema = plain_schema(rows.schema)
    return rows if schema == rows.schema else rows.cast(schema)


def read_rows(
    table: DeltaTable, columns: Sequence[str] | None = None, where: Where | None = None
) -> pa.Table:
    """The rows of ``table``'s current version that ``where`` keeps (all: None), ``columns`` of them
    (all: None), in plain types."""
    filesystem = table_filesystem(table)
    if where is None:
        dataset = table.to_pyarrow_dataset(filesystem=filesystem)
        return plain(dataset.to_table(columns=list(columns) if columns else None))
    dataset = table.to_pyarrow_dataset(file_pruning_predicate=where.files, filesystem=filesystem)
    scanned = None
    if columns is not None and where.columns is not None:
        scanned = list(dict.fromkeys([*columns, *where.columns]))
    parts = [
        plain(pa.Table.from_batches([batch])).filter(where.expression)
        for batch in dataset.to_batches(columns=scanned)
    ]
    rows = pa.concat_tables(parts) if parts else plain_schema(dataset.schema).empty_table()
    return rows.select(list(columns)) if columns is not None else rows


def scan_rows(table: DeltaTable, columns: Sequence[str]) -> Iterator[pa.Table]:
    """``columns`` (stored in the data files: no partition column; a file without one gives nulls)
    of every row of ``table``'s current version, ``SCAN_BATCH_ROWS`` at a time (in plain types): a
    whole-table pass whose memory stays one batch whatever the table's size."""
    # Each file read on its own, a page at a time through a buffered stream: pyarrow's dataset
    # scanner, even without read-ahead, held 300 MiB of a 1 M-row state's documents at its peak
    # (a file read this way, 60 MiB).
    dataset = table.to_pyarrow_dataset(filesystem=table_filesystem(table))
    types = plain_schema(dataset.schema)
    for path in dataset.files:
        with dataset.filesystem.open_input_file(path) as source:
            parquet = pq.ParquetFile(source, buffer_size=_SCAN_BUFFER_BYTES)
            stored = [column for column in columns if column in parquet.schema_arrow.names]
            for batch in parquet.iter_batches(SCAN_BATCH_ROWS, columns=stored, use_threads=False):
                rows = plain(pa.Table.from_batches([batch]))
                yield pa.table(
                    {
                        column: rows.column(column)
                        if column in stored
                        else pa.nulls(len(rows), types.field(column).type)
                        for column in columns
                    }
                )
