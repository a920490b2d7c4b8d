"""Writing raw Parquet files atomically (temp file + rename), with bounded row groups."""

from __future__ import annotations

import os
import uuid

import pyarrow as pa
import pyarrow.parquet as pq

from mongo_cdc.lake import RAW_SCHEMA

# Rows per row group: memory stays flat whatever the backlog, and readers can skip groups.
ROW_GROUP_ROWS = 50_000
# ...and, for large documents, a cap on the BSON bytes behind one row group (the snapshot cuts a
# group early when its documents reach this size, so 50,000 big documents never sit in memory).
ROW_GROUP_BYTES = 64 * 1024 * 1024


def _temp_path(path: str) -> str:
    return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")


def write_table(path: str, table: pa.Table) -> None:
    """Write one complete file; readers see either nothing or the whole file."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    temp = _temp_path(path)
    try:
        pq.write_table(table, temp, row_group_size=ROW_GROUP_ROWS)
        os.replace(temp, path)
    finally:
        if os.path.exists(temp):
            os.remove(temp)


class StreamingFileWriter:
    """Appends row groups to one file that appears under its final name only on ``close``."""

    def __init__(self, path: str) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.path = path
        self.rows = 0
        self._temp = _temp_path(path)
        self._writer = pq.ParquetWriter(self._temp, RAW_SCHEMA)

    def write(self, table: pa.Table) -> None:
        self._writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
        self.rows += table.num_rows

    def close(self) -> None:
        self._writer.close()
        os.replace(self._temp, self.path)

    def abort(self) -> None:
        self._writer.close()
        if os.path.exists(self._temp):
            os.remove(self._temp)
