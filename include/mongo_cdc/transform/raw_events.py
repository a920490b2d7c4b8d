"""Raw lake files: which ones a table still has to apply, and their rows as change events."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import orjson
import pyarrow.parquet as pq

from mongo_cdc.lake import RawFile

_COLUMNS = ["key", "op", "after", "updateDescription", "source", "cluster_time", "event_order"]


class ChangeEvent(NamedTuple):
    document_id: str  # the EJSON of _id, as in the key: {"id": "<EJSON of _id>"}
    op: str | None  # r, c, u, d; None for a tombstone
    after: str | None
    update_description: dict | None  # updatedFields (EJSON text), removedFields, truncatedArrays
    source_ts_ms: int | None
    cluster_time: int
    event_order: str  # hex resume token; "" (a snapshot read) sorts first

    @property
    def position(self) -> tuple[int, str]:
        """Where the event sits in the document's history (compare positions to order events)."""
        return self.cluster_time, self.event_order


def event_from_row(row: dict[str, Any]) -> ChangeEvent:
    source = row["source"]
    return ChangeEvent(
        document_id=orjson.loads(row["key"])["id"],
        op=row["op"],
        after=row["after"],
        update_description=row["updateDescription"],
        source_ts_ms=source["ts_ms"] if source else None,
        cluster_time=row["cluster_time"],
        event_order=row["event_order"],
    )


def read_raw_file(path: str) -> list[ChangeEvent]:
    """Every event of one raw Parquet file, tombstones included, in file order."""
    rows = pq.ParquetFile(path).read(columns=_COLUMNS).to_pylist()
    return [event_from_row(row) for row in rows]


def committed_files(files: Iterable[RawFile], committed: dict[str, int]) -> list[RawFile]:
    """The files that belong to the lake: seq at or below its replica set's committed batch_seq."""
    return [raw for raw in files if raw.rs in committed and raw.seq <= committed[raw.rs]]


def files_after(files: Iterable[RawFile], watermarks: dict[str, int]) -> list[RawFile]:
    """The files not yet applied to a table whose per-replica-set watermarks are given."""
    return [raw for raw in files if raw.seq > watermarks.get(raw.rs, -1)]


def advance_watermarks(watermarks: dict[str, int], committed: dict[str, int]) -> dict[str, int]:
    """Watermarks once every committed file is applied (never moving one back)."""
    return {**watermarks, **{rs: max(seq, watermarks.get(rs, -1)) for rs, seq in committed.items()}}
