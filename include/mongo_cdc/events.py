"""Debezium-style change events built from MongoDB change-stream events and snapshot reads.

Each event becomes one row of ``lake.RAW_SCHEMA``; a delete is followed by a tombstone row
(same key, every value column null) when ``tombstones.on.delete`` is on. Documents are kept as
BSON bytes (the server's own where there are no field rules), so every document round-trips
exactly, whatever its field names; the transform renders JSON and typed columns from them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import bson
import pyarrow as pa
from bson.raw_bson import RawBSONDocument

from mongo_cdc import __version__, extjson
from mongo_cdc.field_filters import CollectionFieldRules
from mongo_cdc.lake import RAW_SCHEMA, hour_partition, pack_cluster_time

CONNECTOR = "mongodb"
VERSION = f"mongo-cdc-{__version__}"

# change-stream operationType -> Debezium op
DATA_OPERATIONS = {"insert": "c", "update": "u", "replace": "u", "delete": "d"}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def bson_bytes(document: Any) -> bytes:
    """The BSON of a document: its own bytes when it was read raw, else encoded again."""
    if isinstance(document, RawBSONDocument):
        return document.raw
    return bson.encode(document)


def token_cluster_time(token: dict) -> int:
    """Packed cluster time of a resume token: its KeyString starts with type byte 0x82 + 8 bytes."""
    data = token["_data"]
    if not data.startswith("82"):
        raise ValueError(f"unexpected resume token layout: {data[:20]}...")
    return int(data[2:18], 16)


@dataclass(frozen=True)
class SourceInfo:
    """The parts of Debezium's ``source`` block that are fixed for one replica set of one source."""

    name: str  # topic.prefix
    rs: str

    def block(
        self,
        db: str,
        collection: str,
        cluster_time: int,
        ts_ms: int,
        snapshot: bool,
        lsid: str | None = None,
        txn_number: int | None = None,
        wall_time: int | None = None,
    ) -> dict[str, Any]:
        return {
            "version": VERSION,
            "connector": CONNECTOR,
            "name": self.name,
            "ts_ms": ts_ms,
            "snapshot": snapshot,
            "db": db,
            "rs": self.rs,
            "collection": collection,
            "ord": cluster_time & 0xFFFFFFFF,
            "lsid": lsid,
            "txnNumber": txn_number,
            # Debezium's common source fields: sequence is for connectors with a multi-part position
            # (never set by its MongoDB connector); ts_us/ts_ns are ts_ms at finer units
            "sequence": None,
            "ts_us": ts_ms * 1000,
            "ts_ns": ts_ms * 1_000_000,
            "wallTime": wall_time,
        }


def event_position(change: dict) -> tuple[int, int]:
    """(packed cluster time, source ts_ms) of a change event; ts_ms is its wall time if it has one."""
    ts = change["clusterTime"]
    wall = change.get("wallTime")
    return pack_cluster_time(ts.time, ts.inc), int(wall) if wall is not None else ts.time * 1000


def change_rows(
    change: dict, source: SourceInfo, tombstones: bool, fields: CollectionFieldRules | None = None
) -> list[dict[str, Any]]:
    """Raw rows for one insert/update/replace/delete change-stream event (``fields``: its collection's
    ``field.exclude.list`` / ``field.renames``)."""
    op = DATA_OPERATIONS[change["operationType"]]
    cluster_time, source_ts_ms = event_position(change)
    wall = change.get("wallTime")
    lsid = change.get("lsid")
    txn_number = change.get("txnNumber")
    full_document = change.get("fullDocument")
    # only with a pre-image capture.mode, and never for inserts
    before_document = change.get("fullDocumentBeforeChange")
    description = change.get("updateDescription")
    if fields is not None:
        full_document = fields.document(full_document) if full_document is not None else None
        before_document = fields.document(before_document) if before_document is not None else None
        description = fields.update_description(description) if description is not None else None
    row = {
        "key": extjson.document_key(change["documentKey"]["_id"]),
        "op": op,
        "ts_ms": now_ms(),
        "before": bson_bytes(before_document) if before_document is not None else None,
        "after": bson_bytes(full_document) if full_document is not None else None,
        "updateDescription": _update_description(description) if description is not None else None,
        "source": source.block(
            change["ns"]["db"],
            change["ns"]["coll"],
            cluster_time,
            source_ts_ms,
            snapshot=False,
            lsid=extjson.encode_str(lsid) if lsid is not None else None,
            txn_number=int(txn_number) if txn_number is not None else None,
            wall_time=int(wall) if wall is not None else None,
        ),
        "cluster_time": cluster_time,
        "event_order": change["_id"]["_data"],
    }
    if op == "d" and tombstones:
        return [row, tombstone_of(row)]
    return [row]


def tombstone_of(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "key": row["key"],
        "op": None,
        "ts_ms": row["ts_ms"],
        "before": None,
        "after": None,
        "updateDescription": None,
        "source": row["source"],
        "cluster_time": row["cluster_time"],
        "event_order": row["event_order"],
    }


def _update_description(description: dict) -> dict[str, Any]:
    return {
        "updatedFields": bson_bytes(description.get("updatedFields") or {}),
        "removedFields": list(description.get("removedFields") or []),
        "truncatedArrays": [
            {"field": t["field"], "newSize": int(t["newSize"])}
            for t in description.get("truncatedArrays") or []
        ],
    }


def rows_to_table(rows: list[dict[str, Any]], seq: int) -> pa.Table:
    """Raw rows as a table of batch ``seq`` (``lake.HISTORY_SEQ`` for backfilled history)."""
    for row in rows:
        row["batch_seq"] = seq
        row["hour"] = hour_partition(row["cluster_time"])
    return pa.Table.from_pylist(rows, schema=RAW_SCHEMA)


class SnapshotColumns:
    """Columnar buffer of one collection's snapshot reads: the hot path of a snapshot.

    Only ``key`` and ``after`` differ per document, and ``after`` is the document's own BSON as the
    server sent it (re-encoded only where field rules changed it); the constant columns are built
    once per flush by repeating a one-row array.
    """

    def __init__(
        self,
        source_block: dict[str, Any],
        cluster_time: int,
        seq: int,
        fields: CollectionFieldRules | None = None,
    ) -> None:
        self._fields = fields
        self._constant = pa.Table.from_pylist(
            [
                {
                    "key": "",
                    "op": "r",
                    "ts_ms": 0,
                    "before": None,
                    "after": None,
                    "updateDescription": None,
                    "source": source_block,
                    "cluster_time": cluster_time,
                    "event_order": "",
                    "transaction": None,
                    "batch_seq": seq,
                    "hour": hour_partition(cluster_time),
                }
            ],
            schema=RAW_SCHEMA,
        )
        self._repeated = self._constant.slice(0, 0)
        self.keys: list[str] = []
        self.afters: list[bytes] = []

    def extend(self, documents: list[dict], raw: list[bytes]) -> None:
        """Buffer documents decoded with ``extjson.DECODE_OPTIONS`` and their BSON bytes."""
        key = extjson.document_key
        self.keys += [key(document["_id"]) for document in documents]
        if self._fields is None:
            self.afters += raw
        else:  # per-document work only when this collection has rules
            self.afters += [bson_bytes(self._fields.document(document)) for document in documents]

    def __len__(self) -> int:
        return len(self.keys)

    def take_table(self) -> pa.Table:
        """The buffered rows as a table; the buffer is emptied."""
        count = len(self.keys)
        if self._repeated.num_rows != count:  # full row groups all have the same size: built once
            self._repeated = self._constant.take(pa.array([0] * count, type=pa.int32()))
        columns = {name: self._repeated.column(name) for name in RAW_SCHEMA.names}
        columns["key"] = pa.array(self.keys, type=pa.string())
        columns["after"] = pa.array(self.afters, type=pa.binary())
        columns["ts_ms"] = pa.repeat(pa.scalar(now_ms(), pa.int64()), count)
        self.keys, self.afters = [], []
        return pa.table([columns[name] for name in RAW_SCHEMA.names], schema=RAW_SCHEMA)
