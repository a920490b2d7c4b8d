"""Data files of an append, written with pyarrow's streaming Parquet writer and committed by delta-rs.

delta-rs' own writer (``write_deltalake``) keeps what it writes in memory well past one file:
measured on 100 k documents of 4 KB, its RSS grew by 400-650 MiB whatever the row-group and
target file sizes, and by ~460 MiB for 1 M small documents, growing with the amount written.
pyarrow's writer streams each record batch to the file as a row group (flat ~80 MiB for the same
data) and is 1.3-2x faster. So appends write their Parquet files here, on a writer thread that
encodes (without the GIL) while the caller builds the next batch, and ``landing`` commits the
files with their add actions; delta-rs still owns every commit.

Files follow delta-rs' layout: ``<table>/<partition>=<value>/part-<uuid>.snappy.parquet`` without
the partition column, snappy-compressed, with the Delta statistics of the table's indexed columns
(``file_statistics``: bounds from the Parquet footer, null counts from Arrow; ``batch_seq`` lets the
transform skip files).
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake.transaction import AddAction

from mongo_cdc.lake.file_statistics import (
    Path,
    column_at,
    file_statistics,
    null_counts,
    statistics_writer,
)
from mongo_cdc.lake.storage import LakeLocation

# A file is closed and the next one started past this many bytes (delta-rs' default target size).
TARGET_FILE_BYTES = 100 * 1024 * 1024
# Record batches waiting for the writer thread: bounds the memory between the caller and the files.
QUEUE_DEPTH = 2
_DONE = object()


@dataclass
class _File:
    """One open data file and the null counts of what it holds so far (its bounds are in its footer)."""

    relative_path: str
    partition: dict[str, str]
    sink: Any
    writer: pq.ParquetWriter
    schema: pa.Schema
    read_back: Callable[[str], pa.Table]
    rows: int = 0
    nulls: dict[Path, int] = field(default_factory=dict)

    def write(self, batch: pa.RecordBatch) -> None:
        self.writer.write_batch(batch)
        self.rows += batch.num_rows
        for path, count in null_counts(batch).items():
            self.nulls[path] = self.nulls.get(path, 0) + count

    def close(self, indexed: Sequence[Path]) -> AddAction:
        self.writer.close()
        size = self.sink.tell()
        self.sink.close()
        stats = file_statistics(
            self.writer.writer.metadata,
            self.schema,
            self.nulls,
            lambda path: column_at(self.read_back(self.relative_path), path),
        )
        return AddAction(
            self.relative_path,
            size,
            self.partition,
            time.time_ns() // 1_000_000,
            True,
            stats.to_json(indexed),
        )


class _TableFiles:
    """The files one append writes into a table, one open file per partition value."""

    def __init__(
        self,
        location: LakeLocation,
        table_path: tuple[str, ...],
        schema: pa.Schema,
        partition: str | None,
        indexed: Sequence[Path],
    ):
        self.location = location
        self.indexed = indexed
        self.table_path = table_path
        self.partition = partition
        self.file_schema = schema.remove(schema.get_field_index(partition)) if partition else schema
        self.open: dict[str | None, _File] = {}
        self.actions: list[AddAction] = []

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        if self.partition is None:
            self._write(None, batch)
            return
        values = batch.column(self.partition)
        distinct = pc.unique(values).to_pylist()
        for value in distinct:
            rows = batch if len(distinct) == 1 else batch.filter(pc.equal(values, value))
            self._write(value, rows.drop_columns([self.partition]))

    def _write(self, value: str | None, batch: pa.RecordBatch) -> None:
        data_file = self.open.get(value)
        if data_file is None:
            data_file = self.open[value] = self._new_file(value)
        data_file.write(batch)
        if data_file.sink.tell() >= TARGET_FILE_BYTES:
            self.actions.append(self.open.pop(value).close(self.indexed))

    def _new_file(self, value: str | None) -> _File:
        # partition values here are hour strings (YYYY-MM-DDTHH): nothing in them needs escaping
        directory = (f"{self.partition}={value}",) if self.partition else ()
        name = f"part-{uuid.uuid4()}.snappy.parquet"
        sink = self.location.open_output(*self.table_path, *directory, name)
        writer = statistics_writer(sink, self.file_schema, use_dictionary=False)
        partition = {self.partition: value} if self.partition else {}
        return _File("/".join((*directory, name)), partition, sink, writer, self.file_schema, self._read_back)

    def _read_back(self, relative_path: str) -> pa.Table:
        filesystem, base = self.location.filesystem()
        return pq.read_table("/".join((base, *self.table_path, relative_path)), filesystem=filesystem)

    def close(self) -> list[AddAction]:
        self.actions += [data_file.close(self.indexed) for data_file in self.open.values()]
        self.open = {}
        return self.actions

    def abandon(self) -> None:
        """Close the open files after a failure; uncommitted, they are never part of the table."""
        for data_file in self.open.values():
            try:
                data_file.writer.close()
            finally:
                data_file.sink.close()
        self.open = {}


def write_files(
    location: LakeLocation,
    table_uri: str,
    data: pa.Table | pa.RecordBatchReader,
    partition: str | None,
    indexed: Sequence[Path],
) -> list[AddAction]:
    """Write ``data`` as new Parquet files of the table at ``table_uri``; their add actions, uncommitted,
    with the statistics of the table's ``indexed`` columns (``file_statistics.indexed_columns``).

    A reader's batches are written by a writer thread while the caller's thread reads the next
    ones (``QUEUE_DEPTH`` batches in between); a table is written in the caller's thread.
    """
    if not table_uri.startswith(location.root):
        raise ValueError(f"table {table_uri} is not under the lake root {location.root}")
    table_path = tuple(part for part in table_uri[len(location.root) :].split("/") if part)
    files = _TableFiles(location, table_path, data.schema, partition, indexed)
    try:
        if isinstance(data, pa.Table):
            for batch in data.to_batches():
                files.write(batch)
        else:
            _write_on_thread(files, data)
        return files.close()
    except BaseException:
        files.abandon()
        raise


def _write_on_thread(files: _TableFiles, batches: Iterable[pa.RecordBatch]) -> None:
    pending: queue.Queue[Any] = queue.Queue(QUEUE_DEPTH)
    failed: list[BaseException] = []

    def writer() -> None:
        try:
            while (batch := pending.get()) is not _DONE:
                files.write(batch)
        except BaseException as exc:  # handed to the caller's thread
            failed.append(exc)
            while pending.get() is not _DONE:  # let the caller finish putting without blocking
                pass

    thread = threading.Thread(target=writer, name="lake-files", daemon=True)
    thread.start()
    try:
        for batch in _until(batches, failed):
            pending.put(batch)
    finally:
        pending.put(_DONE)
        thread.join()
    if failed:
        raise failed[0]


def _until(batches: Iterable[pa.RecordBatch], failed: list[BaseException]) -> Iterator[pa.RecordBatch]:
    """``batches`` until the writer thread fails."""
    for batch in batches:
        if failed:
            return
        yield batch
