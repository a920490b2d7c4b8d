"""Debezium-style change events built from MongoDB change-stream events and snapshot reads.

Each event becomes one row of ``lake.RAW_SCHEMA``; a delete is followed by a tombstone row
(same key, every value column null) when ``tombstones.on.delete`` is on. Documents are kept as
BSON bytes (the server's own where there are no field rules), so every document round-trips
exactly, whatever its field names; the transform renders JSON and typed columns from them.
"""

from __future__ import annotations

import binascii
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import bson
import pyarrow as pa
import pyarrow.compute as pc
from bson.errors import InvalidBSON
from bson.raw_bson import RawBSONDocument

from mongo_cdc import __version__, extjson
from mongo_cdc.capture.field_filters import CollectionFieldRules
from mongo_cdc.extjson import DECODE_OPTIONS
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


# A document whose first element is an ObjectId named _id (as MongoDB stores nearly every one): its
# key is built from the 12 bytes after this head, in bulk, with no decoding.
_OBJECT_ID_HEAD = b"\x07_id\x00"
_OBJECT_ID_AT = (4 + len(_OBJECT_ID_HEAD), 4 + len(_OBJECT_ID_HEAD) + 12)
# extjson.document_key of an ObjectId, around its hex digits
_OBJECT_ID_KEY = (b'{"id":"{\\"$oid\\":\\"', b'\\"}"}')
_document_size = struct.Struct("<i").unpack_from


def raw_documents(batch: bytes) -> pa.BinaryArray:
    """The BSON documents concatenated in ``batch`` as a binary array over the same bytes (no copy)."""
    offsets, pos, end = [0], 0, len(batch)
    add = offsets.append
    while pos + 4 <= end:
        size = _document_size(batch, pos)[0]
        if size < 5:
            break
        pos += size
        add(pos)
    if pos != end:
        raise InvalidBSON(f"bad document length at byte {offsets[-1]} of a batch of {end} bytes")
    return pa.BinaryArray.from_buffers(
        pa.binary(), len(offsets) - 1, [None, pa.array(offsets, pa.int32()).buffers()[1], pa.py_buffer(batch)]
    )


def document_keys(documents: pa.BinaryArray) -> pa.StringArray:
    """``extjson.document_key`` of each raw document's ``_id``: ObjectIds in bulk, others decoded."""
    heads = pc.binary_slice(documents, 4, _OBJECT_ID_AT[0])
    fast = pc.equal(heads, pa.scalar(_OBJECT_ID_HEAD, pa.binary()))
    if not pc.all(fast).as_py():
        key = extjson.document_key
        return pa.array(
            [key(bson.decode(document, DECODE_OPTIONS)["_id"]) for document in documents.to_pylist()],
            pa.string(),
        )
    object_ids = pc.binary_slice(documents, *_OBJECT_ID_AT)  # 12 bytes each, contiguous
    digits = binascii.hexlify(object_ids.buffers()[2].to_pybytes()[: 12 * len(object_ids)])
    hex_ids = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(24), len(object_ids), [None, pa.py_buffer(digits)]
    )
    head, tail = _OBJECT_ID_KEY
    return pc.binary_join_element_wise(head, hex_ids.cast(pa.binary()), tail, b"").cast(pa.string())


def keys_and_documents(
    documents: pa.BinaryArray, fields: CollectionFieldRules | None = None
) -> tuple[pa.Array, pa.Array]:
    """The raw ``key`` and ``after`` columns of documents read from a collection: their own bytes,
    or rewritten by the collection's field rules (``field.exclude.list``, ``field.renames``)."""
    if fields is None:
        return document_keys(documents), documents
    # per-document work only when the collection has rules
    decoded = [bson.decode(document, DECODE_OPTIONS) for document in documents.to_pylist()]
    keys = pa.array([extjson.document_key(document["_id"]) for document in decoded], pa.string())
    return keys, pa.array([bson_bytes(fields.document(document)) for document in decoded], pa.binary())


class SnapshotColumns:
    """Snapshot reads of one collection as Arrow record batches: the hot path of a snapshot.

    Only ``key`` and ``after`` differ per document. ``after`` is the server's batch itself, cut
    into documents without copying (re-encoded only where field rules change documents); keys of
    ObjectId ``_id``s are built in bulk. The constant columns are built once and sliced.
    """

    def __init__(
        self,
        source_block: dict[str, Any],
        cluster_time: int,
        seq: int,
        fields: CollectionFieldRules | None = None,
        max_rows: int = 50_000,
    ) -> None:
        self._fields = fields
        self.max_rows = max_rows
        constant = pa.Table.from_pylist(
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
        self._constant = constant.take(pa.array([0] * max_rows, pa.int32())).combine_chunks().to_batches()[0]

    def record_batches(self, batch: bytes) -> Iterator[pa.RecordBatch]:
        """The rows of one batch of raw documents (concatenated BSON), ``max_rows`` at most a record batch."""
        documents = raw_documents(batch)
        for start in range(0, len(documents), self.max_rows):
            yield self._rows(documents.slice(start, self.max_rows))

    def _rows(self, documents: pa.BinaryArray) -> pa.RecordBatch:
        count = len(documents)
        keys, afters = keys_and_documents(documents, self._fields)
        columns = self._constant.slice(0, count).columns
        columns[RAW_SCHEMA.get_field_index("key")] = keys
        columns[RAW_SCHEMA.get_field_index("after")] = afters
        columns[RAW_SCHEMA.get_field_index("ts_ms")] = pa.repeat(pa.scalar(now_ms(), pa.int64()), count)
        return pa.RecordBatch.from_arrays(columns, schema=RAW_SCHEMA)
