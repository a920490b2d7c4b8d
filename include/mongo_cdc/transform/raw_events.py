"""Raw lake batches: which files and snapshot manifests a table still has to apply, and raw rows as events."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple, Protocol, TypeVar

import orjson
import pyarrow.parquet as pq
from bson import json_util
from bson.codec_options import DatetimeConversion
from bson.json_util import JSONOptions

from mongo_cdc.lake import parse_history_file, parse_raw_file

_COLUMNS = ["key", "op", "ts_ms", "after", "updateDescription", "source", "cluster_time", "event_order"]


class ChangeEvent(NamedTuple):
    """One change event, its documents BSON-decoded (``bson.decode(data, extjson.DECODE_OPTIONS)``)."""

    document_id: Any  # the _id value
    op: str | None  # r, c, u, d; None for a tombstone
    ts_ms: int | None  # when mongo-cdc processed the event
    after: dict | None
    # updatedFields (a document whose field names are dotted paths), removedFields, truncatedArrays
    update_description: dict | None
    source: dict[str, Any] | None  # the raw source struct: ts_ms, rs, collection... (see lake.RAW_SCHEMA)
    cluster_time: int
    event_order: str  # hex resume token; "" (a snapshot read) sorts first
    rs: str  # the replica set whose oplog or snapshot the event came from (its raw file's rs)

    @property
    def position(self) -> tuple[int, str]:
        """Where the event sits in the document's history (compare positions to order events)."""
        return self.cluster_time, self.event_order


def event_from_row(row: dict[str, Any], rs: str) -> ChangeEvent:
    update_description = row["updateDescription"]
    if update_description is not None:
        updated_fields = update_description["updatedFields"]
        update_description = {
            **update_description,
            "updatedFields": None if updated_fields is None else _decode(updated_fields),
        }
    return ChangeEvent(
        document_id=_decode(orjson.loads(row["key"])["id"]),
        op=row["op"],
        ts_ms=row["ts_ms"],
        after=None if row["after"] is None else _decode(row["after"]),
        update_description=update_description,
        source=row["source"],
        cluster_time=row["cluster_time"],
        event_order=row["event_order"],
        rs=rs,
    )


# Raw files hold Extended JSON text until the raw zone carries BSON; json_util reads it back into
# the values bson.decode gives (a document field named like a wrapper, {"$numberLong": ...}, is
# read as the wrapped value: the reason the raw zone moves to BSON).
_JSON_OPTIONS = JSONOptions(datetime_conversion=DatetimeConversion.DATETIME_MS)


def _decode(text: str) -> Any:
    return json_util.loads(text, json_options=_JSON_OPTIONS)


def read_raw_file(path: str) -> list[ChangeEvent]:
    """Every event of one raw (or history) Parquet file, tombstones included, in file order."""
    rows = pq.ParquetFile(path).read(columns=_COLUMNS).to_pylist()
    rs = (parse_raw_file(path) or parse_history_file(path)).rs
    return [event_from_row(row, rs) for row in rows]


class Batched(Protocol):
    """Part of a replica set's numbered batch: a raw file or a snapshot manifest."""

    @property
    def rs(self) -> str: ...

    @property
    def seq(self) -> int: ...


BatchedT = TypeVar("BatchedT", bound=Batched)


def committed_files(files: Iterable[BatchedT], committed: dict[str, int]) -> list[BatchedT]:
    """The files that belong to the lake: seq at or below its replica set's committed batch_seq."""
    return [raw for raw in files if raw.rs in committed and raw.seq <= committed[raw.rs]]


def files_after(files: Iterable[BatchedT], watermarks: dict[str, int]) -> list[BatchedT]:
    """The files not yet applied to a table whose per-replica-set watermarks are given."""
    return [raw for raw in files if raw.seq > watermarks.get(raw.rs, -1)]


def advance_watermarks(watermarks: dict[str, int], committed: dict[str, int]) -> dict[str, int]:
    """Watermarks once every committed file is applied (never moving one back)."""
    return {**watermarks, **{rs: max(seq, watermarks.get(rs, -1)) for rs, seq in committed.items()}}
