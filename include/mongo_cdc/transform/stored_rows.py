"""Stored rows read by document key: the task that needs a document's stored version or deletion
marker reads it from the table's files, so the driver holds no per-document data of the run.

* ``keyed_files`` (the driver's side): a keyed table's data files with their keys' range
  (``KeyedFile``), from its file actions, handed to the tasks in their specs;
* ``keyed_rows`` (the executors' side): the rows of given keys in those files, skipping a file or
  row group whose key range holds none of them;
* ``deletion_markers`` and ``stored_versions``: those rows as ``DocumentVersion``.

Runs on the executors: no pyspark or deltalake import here.
"""

from __future__ import annotations

from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mongo_cdc.lake.storage import LakeLocation, file_stats
from mongo_cdc.lake.table_reads import plain
from mongo_cdc.transform.document_state import DocumentVersion
from mongo_cdc.transform.raw_slices import lake_path
from mongo_cdc.transform.table_formats import DELETION_COLUMNS, STORED_VERSION_COLUMNS


class KeyedFile(NamedTuple):
    """A data file of a table keyed by ``__key`` (state, deletion markers): its path under the lake
    root and its keys' range (None: unknown)."""

    path: str
    min_key: str | None
    max_key: str | None


def keyed_files(actions: pa.Table | None, table_path: str) -> tuple[KeyedFile, ...]:
    """The data files of a table keyed by ``__key`` (``actions``: its ``file_actions``; ``table_path``:
    under the lake root), with their keys' range where the statistics hold it."""
    if actions is None:
        return ()
    unknown = [None] * actions.num_rows
    return tuple(
        KeyedFile(f"{table_path}/{path}", low, high)
        for path, low, high in zip(
            actions.column("path").to_pylist(),
            file_stats(actions, "min", "__key") or unknown,
            file_stats(actions, "max", "__key") or unknown,
            strict=True,
        )
    )


def keyed_rows(
    location: LakeLocation, files: tuple[KeyedFile, ...], keys: pa.Array, columns: list[str]
) -> pa.Table | None:
    """``columns`` of the rows of ``files`` whose ``__key`` is one of ``keys``; None if none is. A
    file or row group whose key range holds none of them is skipped, and only the ``__key`` column
    of the rest is read until one matches."""
    if not len(keys) or not files:
        return None
    low, high = (value.as_py() for value in pc.min_max(keys).values())
    filesystem, base = location.filesystem()
    parts = []
    for file in files:
        if (file.max_key is not None and file.max_key < low) or (
            file.min_key is not None and high < file.min_key
        ):
            continue
        parquet = pq.ParquetFile(lake_path(base, file.path), filesystem=filesystem)
        for group in range(parquet.num_row_groups):
            if not _may_hold(parquet.metadata.row_group(group), low, high):
                continue
            found = pc.is_in(plain(parquet.read_row_group(group, ["__key"])).column("__key"), keys)
            if pc.any(found).as_py():
                parts.append(plain(parquet.read_row_group(group, columns)).filter(found))
    return pa.concat_tables(parts) if parts else None


def _may_hold(group: pq.RowGroupMetaData, low: str, high: str) -> bool:
    """Whether a row group's ``__key`` statistics allow a key in [low, high] (no statistics: yes),
    compared as UTF-8 bytes, as Parquet orders them."""
    for index in range(group.num_columns):
        column = group.column(index)
        statistics = column.statistics
        if column.path_in_schema == "__key" and statistics is not None and statistics.has_min_max:
            minimum, maximum = (
                value.encode() if isinstance(value, str) else value
                for value in (statistics.min, statistics.max)
            )
            return not (maximum < low.encode() or high.encode() < minimum)
    return True


def deletion_markers(
    location: LakeLocation, files: tuple[KeyedFile, ...], keys: pa.Array
) -> dict[str, DocumentVersion]:
    """The deletion markers of ``keys`` (in the markers' ``files``), as versions without a document."""
    rows = keyed_rows(location, files, keys, list(DELETION_COLUMNS))
    if rows is None:
        return {}
    return {
        row["__key"]: DocumentVersion(
            row["__key"], "", None, row["__cluster_time"], row["__event_order"], row["__rs"]
        )
        for row in rows.to_pylist()
    }


def stored_versions(
    location: LakeLocation, files: tuple[KeyedFile, ...], keys: pa.Array
) -> dict[str, DocumentVersion]:
    """The stored versions of ``keys`` (in the state table's ``files``)."""
    rows = keyed_rows(location, files, keys, list(STORED_VERSION_COLUMNS))
    if rows is None:
        return {}
    return {
        row["__key"]: DocumentVersion(*(row[name] for name in STORED_VERSION_COLUMNS))
        for row in rows.to_pylist()
    }
