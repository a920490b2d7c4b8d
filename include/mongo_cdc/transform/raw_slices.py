"""Raw slices: a raw table's data files cut into the pieces a Spark task reads at a time.

The driver lists a raw table's files (``raw_files``) and cuts them into slices of about
``SLICE_ROWS`` rows (``raw_slices``); a Spark task reads each of its slices in turn as an Arrow table
(``read_slice``). Runs on the executors too, which have only pyarrow, orjson and bson: no pyspark
or deltalake import here (``DeltaTable`` only for type checking).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mongo_cdc import lake
from mongo_cdc.lake.storage import LakeLocation, file_actions, file_stats
from mongo_cdc.lake.table_reads import plain
from mongo_cdc.transform.raw_events import RAW_COLUMNS

if TYPE_CHECKING:
    from deltalake import DeltaTable

# Raw rows per slice: a task writes a state file and a change file per hour of each slice's rows.
# Fewer when that keeps every core busy, but not below MIN_SLICE_ROWS (tiny files).
SLICE_ROWS = 50_000
MIN_SLICE_ROWS = 5_000
# Parquet bytes of raw rows per slice, whatever the rows: a task holds its documents' BSON many times
# over while it builds their columns (slices of 32 MiB, 33,000 nested documents of ~4 KB, took a
# worker to 3 GiB; 50,000 of them to 3.9 GiB)
SLICE_BYTES = 8 * 1024 * 1024


class RawFile(NamedTuple):
    """A data file of a raw table: its path under the lake root, partition, batch range, rows and
    first key (the statistics' minimum of ``key``: None where unknown)."""

    path: str
    hour: str
    min_seq: int | None
    max_seq: int | None
    rows: int
    size: int  # bytes
    min_key: str | None = None


class RawPiece(NamedTuple):
    """Rows of one raw file: some of its row groups, or all of it (``row_groups`` None)."""

    path: str
    row_groups: tuple[int, ...] | None


# A slice of the raw events: the pieces one Spark task reads, about SLICE_ROWS rows in all.
RawSlice = tuple[RawPiece, ...]


def raw_files(table: DeltaTable, table_path: str) -> list[RawFile]:
    actions = file_actions(table)
    unknown = [None] * actions.num_rows
    return [
        RawFile(f"{table_path}/{path}", hour, low, high, rows or 0, size or 0, first_key)
        for path, hour, low, high, rows, size, first_key in zip(
            actions.column("path").to_pylist(),
            file_stats(actions, "partition", "hour") or unknown,
            file_stats(actions, "min", "batch_seq") or unknown,
            file_stats(actions, "max", "batch_seq") or unknown,
            actions.column("num_records").to_pylist(),
            actions.column("size_bytes").to_pylist(),
            file_stats(actions, "min", "key") or unknown,
            strict=True,
        )
    ]


def raw_slices(location: LakeLocation, files: list[RawFile], parallelism: int) -> list[RawSlice]:
    """``files`` in slices of about SLICE_ROWS rows (fewer when that keeps every core busy) and at most
    about SLICE_BYTES, in batch order, so each slice's change files cover few hours and its state file
    a narrow range of keys; the files of one batch (a snapshot's chunks) in the order of their first
    key, so a first build's state files hold disjoint key ranges (a chunk's rows follow its ``_id``
    index) and a point lookup opens one of them.

    Small files (a pull's batches) are grouped; a large one (a snapshot's) is split at its row groups.
    """
    total = sum(file.rows for file in files)
    target = max(MIN_SLICE_ROWS, min(SLICE_ROWS, -(-total // max(1, parallelism))))
    pieces: list[tuple[RawPiece, int, float]] = []  # a piece, its rows and (about) its bytes
    filesystem, base = location.filesystem()
    for file in sorted(files, key=lambda file: (file.min_seq or 0, file.min_key or "", file.path)):
        row_bytes = file.size / max(1, file.rows)
        groups = []
        if file.rows > target or file.size > SLICE_BYTES:
            metadata = pq.ParquetFile(lake_path(base, file.path), filesystem=filesystem).metadata
            groups = [metadata.row_group(index).num_rows for index in range(metadata.num_row_groups)]
        if len(groups) < 2:
            pieces.append((RawPiece(file.path, None), file.rows, file.size))
            continue
        start, rows = 0, 0
        for index, count in enumerate(groups):
            rows += count
            if rows >= target or rows * row_bytes >= SLICE_BYTES or index == len(groups) - 1:
                pieces.append((RawPiece(file.path, tuple(range(start, index + 1))), rows, rows * row_bytes))
                start, rows = index + 1, 0
    slices: list[RawSlice] = []
    current: list[RawPiece] = []
    rows, size = 0, 0.0
    for piece, count, piece_size in pieces:
        current.append(piece)
        rows += count
        size += piece_size
        if rows >= target or size >= SLICE_BYTES:
            slices.append(tuple(current))
            current, rows, size = [], 0, 0.0
    if current:
        slices.append(tuple(current))
    return slices


def lake_path(base: str, path: str) -> str:
    """``path`` (under the lake root) as ``LakeLocation.filesystem`` names it under ``base``."""
    return f"{base}/{path}" if base else path


def read_slice(
    location: LakeLocation, raw_slice: RawSlice, row_filter: pc.Expression, columns: list[str] = RAW_COLUMNS
) -> pa.Table:
    """The rows of ``raw_slice`` that pass ``row_filter``, in plain types (a file a delta-rs DELETE
    rewrote holds ``string_view``)."""
    return concat_pieces(read_pieces(location, raw_slice, row_filter, columns))


def concat_pieces(pieces: Iterable[pa.Table]) -> pa.Table:
    """A slice's pieces as one table: a column two raw files type differently is unified, not an error."""
    return pa.concat_tables(pieces, promote_options="permissive")


def read_pieces(
    location: LakeLocation, raw_slice: RawSlice, row_filter: pc.Expression, columns: list[str]
) -> Iterator[pa.Table]:
    """``read_slice``, a table per piece of the slice."""
    filesystem, base = location.filesystem()
    for piece in raw_slice:
        file = pq.ParquetFile(lake_path(base, piece.path), filesystem=filesystem)
        rows = (
            file.read(columns)
            if piece.row_groups is None
            else file.read_row_groups(piece.row_groups, columns)
        )
        yield plain(rows).filter(row_filter)


def collection_operations(rows: pa.Table) -> pa.ChunkedArray:
    """Which raw rows are a drop or rename of the collection (no document)."""
    return pc.fill_null(pc.is_in(rows.column("op"), pa.array(sorted(lake.COLLECTION_OPERATIONS))), False)
