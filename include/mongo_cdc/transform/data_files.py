"""Parquet data files that Spark's executors write and the driver commits to a Delta table at once.

An executor writes each file under its table directory (``write_data_file``) and hands the driver
a ``DataFile``: its path relative to the table, size, rows, partition values and Delta
statistics. The driver commits the files of all executors in one transaction
(``add_actions`` gives delta-rs' add actions), so the data never travels through the driver and
needs no second write; rows staged for a MERGE or a rewrite are read back (``staged_rows``). Files
that no commit names are not part of the table: every Delta reader ignores them, and the transform
deletes those it wrote but did not commit (``delete_data_files``).

Statistics are ``numRecords`` and each leaf column's ``nullCount`` and, where its type has them, its
bounds from the Parquet footer (``lake.file_statistics``); the driver's commit keeps those of the
columns the table indexes. With them every reader skips files a predicate cannot match (a MERGE on
``__key`` reads and rewrites only the files that may hold a source key). Executors need no
deltalake: only ``add_actions`` imports it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from mongo_cdc.lake.file_statistics import (
    FileStatistics,
    Path,
    column_at,
    file_statistics,
    null_counts,
    statistics_writer,
)
from mongo_cdc.lake.storage import LakeLocation
from mongo_cdc.transform.raw_slices import lake_path
from mongo_cdc.transform.table_layout import widened

if TYPE_CHECKING:
    from deltalake.transaction import AddAction

# ``__key``'s bounds cut a MERGE's key ranges (``merge_ranges``), so they are kept exact up to
# ``KEY_PREFIX_LENGTH`` characters. At Delta's usual 32, an ObjectId's key (34) loses its closing
# ``"]``, a file's incremented upper bound then equals the next file's lower bound when that is the
# next ObjectId, and a state of ObjectIds made one after another was one range, MERGEd by one task
# on any number of executors.
KEY_PATH = ("__key",)
KEY_PREFIX_LENGTH = 256


class DataFile(NamedTuple):
    path: str  # relative to the table: [<partition column>=<value>/]part-<uuid>-c000.snappy.parquet
    size: int
    rows: int
    partition: tuple[tuple[str, str], ...]
    stats: str  # Delta statistics JSON
    modified_ms: int


def write_data_file(
    location: LakeLocation,
    directory: str,
    rows: pa.Table,
    partition: tuple[tuple[str, str], ...] = (),
    unique_columns: Collection[str] = (),
) -> DataFile:
    """Write ``rows`` (without the partition columns) as a new file under ``directory`` (a path
    under the lake root, e.g. ``state/<prefix>/<db>/<collection>``). ``unique_columns`` hold a
    value of its own in (nearly) every row, such as a document's text: they are written without a
    dictionary, which Parquet's writer would otherwise build by hashing every value, only to fall
    back to plain values once it grows too large."""
    name = f"part-00000-{uuid.uuid4()}-c000.snappy.parquet"
    relative = "/".join([*(f"{column}={value}" for column, value in partition), name])
    sink = pa.BufferOutputStream()
    dictionary = [
        path for field in rows.schema if field.name not in unique_columns for path in leaf_paths(field)
    ]
    writer = statistics_writer(sink, rows.schema, dictionary)
    writer.write_table(rows)
    writer.close()
    data = sink.getvalue()
    with location.open_output(*directory.split("/"), *relative.split("/")) as out:
        out.write(data)
    stats = file_statistics(
        writer.writer.metadata,
        rows.schema,
        null_counts(rows),
        lambda path: column_at(rows, path),
        {KEY_PATH: KEY_PREFIX_LENGTH},
    )
    return DataFile(relative, data.size, rows.num_rows, partition, stats.to_json(), _now_ms())


def leaf_paths(field: pa.Field, parent: str = "") -> list[str]:
    """The Parquet column paths of ``field``'s leaves, as the Parquet writer names them (a list's
    elements ``<name>.list.element``, a map's ``<name>.key_value.key`` and ``.value``)."""
    path = f"{parent}{field.name}"
    kind = field.type
    if pa.types.is_struct(kind):
        return [leaf for child in kind for leaf in leaf_paths(child, f"{path}.")]
    if pa.types.is_map(kind):
        return leaf_paths(kind.key_field, f"{path}.key_value.") + leaf_paths(
            kind.item_field, f"{path}.key_value."
        )
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return leaf_paths(kind.value_field.with_name("element"), f"{path}.list.")
    return [path]


def _now_ms() -> int:
    return int(time.time() * 1000)


def add_actions(files: Iterable[DataFile], indexed: Sequence[Path]) -> list[AddAction]:
    """delta-rs add actions of ``files`` (for ``create_write_transaction`` and the like), their
    statistics those of the table's ``indexed`` columns (``file_statistics.indexed_columns``)."""
    from deltalake.transaction import AddAction

    return [
        AddAction(
            file.path,
            file.size,
            dict(file.partition),
            file.modified_ms,
            True,
            FileStatistics.from_json(file.stats).to_json(indexed),
        )
        for file in files
    ]


def staged_rows(
    location: LakeLocation, directory: str, files: list[DataFile], schema: pa.Schema
) -> pa.RecordBatchReader:
    """The rows of staged ``files``, one file at a time, as rows of ``schema`` (``widened``)."""
    filesystem, base = location.filesystem()

    def batches() -> Iterator[pa.RecordBatch]:
        for file in files:
            path = lake_path(base, f"{directory}/{file.path}")
            rows = pq.ParquetFile(path, filesystem=filesystem).read()  # read_table's dataset costs ~1 ms more
            for column, value in file.partition:
                rows = rows.append_column(column, pa.array([value] * rows.num_rows, pa.string()))
            yield from widened(rows, schema).to_batches()

    return pa.RecordBatchReader.from_batches(schema, batches())


def delete_data_files(location: LakeLocation, directory: str, files: Iterable[DataFile]) -> None:
    """Delete files written under ``directory`` that no commit will name."""
    filesystem, base = location.filesystem()
    for file in files:
        filesystem.delete_file(f"{base}/{directory}/{file.path}")


def delete_directory(location: LakeLocation, directory: str) -> None:
    """Delete ``directory`` (under the lake root) and everything in it, if it exists."""
    from pyarrow.fs import FileType

    filesystem, base = location.filesystem()
    path = f"{base}/{directory}"
    if filesystem.get_file_info(path).type != FileType.NotFound:
        filesystem.delete_dir(path)
