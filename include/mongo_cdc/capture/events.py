"""Debezium-style change events built from MongoDB change-stream events and snapshot reads.

Each event becomes one row of ``lake.RAW_SCHEMA``; a delete is followed by a tombstone row
(same key, every value column null) when ``tombstones.on.delete`` is on. Documents are kept as
BSON bytes (the server's own where there are no field rules), so every document round-trips
exactly, whatever its field names and types; the transform renders JSON and typed columns from them.

Change events are read as ``RawBSONDocument``s (``open_change_stream``): only an event's top level
is decoded, on first use, and ``fullDocument``, ``fullDocumentBeforeChange`` and ``updatedFields``
stay the bytes the server sent. A document's key comes from its ``_id`` element alone
(``document_id``), so nothing else in it is decoded, whatever it holds (invalid UTF-8 included).
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
from bson import ObjectId
from bson.errors import InvalidBSON
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient
from pymongo.change_stream import ClusterChangeStream

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


# Change events as RawBSONDocuments: the top level decodes on first use (dates as exact milliseconds),
# every embedded document stays a RawBSONDocument over the server's bytes.
RAW_EVENT_OPTIONS = DECODE_OPTIONS.with_options(document_class=RawBSONDocument)


def open_change_stream(client: MongoClient, **options: Any) -> ClusterChangeStream:
    """``client.watch(**options)`` whose events are ``RawBSONDocument``s (``RAW_EVENT_OPTIONS``)."""
    stream = ClusterChangeStream(
        client.get_database("admin", codec_options=RAW_EVENT_OPTIONS),
        options.pop("pipeline", None),
        options.pop("full_document", None),
        options.pop("resume_after", None),
        options.pop("max_await_time_ms", None),
        options.pop("batch_size", None),
        None,  # collation
        options.pop("start_at_operation_time", None),
        None,  # session
        options.pop("start_after", None),
        full_document_before_change=options.pop("full_document_before_change", None),
    )
    if options:
        raise TypeError(f"unexpected change stream options: {sorted(options)}")
    stream._initialize_cursor()
    return stream


def plain_token(token: Any) -> dict | None:
    """A resume token as a dict (offsets store and compare it so), whether it was read raw or not."""
    return bson.decode(token.raw) if isinstance(token, RawBSONDocument) else token


# the small documents of an event's metadata, which every event reads: decoded with the top level
_METADATA_DOCUMENTS = ("_id", "ns", "to", "updateDescription")


def event_fields(event: RawBSONDocument) -> dict[str, Any]:
    """A raw change event's top level as a dict (its ``_id``, ``ns``, ``to`` and ``updateDescription``
    too): ``fullDocument``, ``fullDocumentBeforeChange``, ``documentKey``, ``updatedFields`` and
    ``lsid`` stay RawBSONDocuments over the server's bytes. The stream decoded the top level already
    (to read the resume token): its ``items`` are taken as they are, so no dict lookup goes through
    RawBSONDocument's per-access path."""
    fields = dict(event.items())
    for name in _METADATA_DOCUMENTS:
        value = fields.get(name)
        if isinstance(value, RawBSONDocument):
            fields[name] = dict(value.items())
    return fields


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
    change: RawBSONDocument, source: SourceInfo, tombstones: bool, fields: CollectionFieldRules | None = None
) -> list[dict[str, Any]]:
    """Raw rows for one insert/update/replace/delete change-stream event, read raw
    (``open_change_stream``): its documents land as the server's bytes (``fields``: its collection's
    ``field.exclude.list`` / ``field.renames``, which rewrite them)."""
    op = DATA_OPERATIONS[change["operationType"]]
    cluster_time, source_ts_ms = event_position(change)
    wall = change.get("wallTime")
    lsid = change.get("lsid")
    txn_number = change.get("txnNumber")
    after = _raw_bytes(change.get("fullDocument"))
    # only with a pre-image capture.mode, and never for inserts
    before = _raw_bytes(change.get("fullDocumentBeforeChange"))
    description = change.get("updateDescription")
    update_description = _update_description(description) if description is not None else None
    if fields is not None:
        after, before, update_description = apply_field_rules(fields, after, before, update_description)
    row = {
        "key": extjson.document_key(document_id(bson_bytes(change["documentKey"]))),
        "op": op,
        "ts_ms": now_ms(),
        "before": before,
        "after": after,
        "updateDescription": update_description,
        "source": source.block(
            change["ns"]["db"],
            change["ns"]["coll"],
            cluster_time,
            source_ts_ms,
            snapshot=False,
            lsid=extjson.encode_str(bson.decode(bson_bytes(lsid), DECODE_OPTIONS))
            if lsid is not None
            else None,
            txn_number=int(txn_number) if txn_number is not None else None,
            wall_time=int(wall) if wall is not None else None,
        ),
        "cluster_time": cluster_time,
        "event_order": change["_id"]["_data"],
    }
    if op == "d" and tombstones:
        return [row, tombstone_of(row)]
    return [row]


def apply_field_rules(
    fields: CollectionFieldRules,
    after: bytes | None,
    before: bytes | None,
    update_description: dict[str, Any] | None,
) -> tuple[bytes | None, bytes | None, dict[str, Any] | None]:
    """An event's documents and update description (as raw rows hold them) after its collection's
    field rules: the one place the change-stream path hands documents to ``field_filters``."""

    def rewritten(document: bytes | None) -> bytes | None:
        return fields.document(document) if document is not None else None

    if update_description is not None:
        update_description = fields.update_description(update_description)
    return rewritten(after), rewritten(before), update_description


def _raw_bytes(document: RawBSONDocument | None) -> bytes | None:
    return document.raw if document is not None else None


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


def _update_description(description: Any) -> dict[str, Any]:
    """A raw row's ``updateDescription``: ``updatedFields`` as the server's bytes."""
    updated = description.get("updatedFields")
    return {
        "updatedFields": bson_bytes(updated) if updated is not None else _EMPTY_DOCUMENT,
        "removedFields": list(description.get("removedFields") or []),
        "truncatedArrays": [
            {"field": t["field"], "newSize": int(t["newSize"])}
            for t in description.get("truncatedArrays") or []
        ],
    }


def rows_to_table(rows: list[dict[str, Any]], seq: int) -> pa.Table:
    """Raw rows as a table of batch ``seq`` (``lake.HISTORY_SEQ`` for backfilled history), built
    column by column (converting the ``source`` struct row by row dominated a pull's CPU)."""
    columns = []
    for name, arrow_type in _RAW_COLUMNS:
        if name == "source" and all(row.get("source") is not None for row in rows):
            sources = [row["source"] for row in rows]
            children = [
                pa.array([source.get(child) for source in sources], kind) for child, kind in _SOURCE_FIELDS
            ]
            columns.append(pa.StructArray.from_arrays(children, fields=list(arrow_type)))
        elif name == "batch_seq":
            columns.append(pa.repeat(pa.scalar(seq, pa.int64()), len(rows)))
        elif name == "hour":
            columns.append(pa.array([hour_partition(row["cluster_time"]) for row in rows], pa.string()))
        else:
            columns.append(pa.array([row.get(name) for row in rows], arrow_type))
    return pa.Table.from_arrays(columns, schema=RAW_SCHEMA)


# (name, type) of RAW_SCHEMA's columns and of its source struct's fields, read once (a pyarrow
# field's name is a new string at every access)
_RAW_COLUMNS = tuple((field.name, field.type) for field in RAW_SCHEMA)
_SOURCE_FIELDS = tuple((field.name, field.type) for field in RAW_SCHEMA.field("source").type)
_EMPTY_DOCUMENT = bson.encode({})

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


# Sizes of BSON values by type byte: fixed, or how a value's leading int32 counts its bytes
_FIXED_SIZES = {0x01: 8, 0x06: 0, 0x07: 12, 0x08: 1, 0x09: 8, 0x0A: 0, 0x10: 4, 0x11: 8, 0x12: 8,
                0x13: 16, 0x7F: 0, 0xFF: 0}  # fmt: skip
_SELF_COUNTING = frozenset((0x03, 0x04, 0x0F))  # documents, arrays, code with scope
# + what follows the counted bytes: strings, JavaScript code, symbols; binaries (their subtype byte)
# and DBPointers (their ObjectId)
_COUNTED_AFTER_LENGTH = {0x02: 4, 0x0D: 4, 0x0E: 4, 0x05: 5, 0x0C: 16}
_ID_ELEMENT_NAME = b"_id\x00"


def _id_element(document: bytes) -> bytes:
    """The bytes of a BSON document's top-level ``_id`` element (type, name, value), found by
    walking element headers: no value is decoded."""
    pos, end = 4, len(document) - 1
    while pos < end:
        kind = document[pos]
        name_end = document.index(b"\x00", pos + 1) + 1
        value = name_end
        if kind in _FIXED_SIZES:
            value_end = value + _FIXED_SIZES[kind]
        elif kind in _SELF_COUNTING:
            value_end = value + _document_size(document, value)[0]
        elif kind in _COUNTED_AFTER_LENGTH:
            value_end = value + _document_size(document, value)[0] + _COUNTED_AFTER_LENGTH[kind]
        elif kind == 0x0B:  # regular expression: pattern and options, two C strings
            value_end = document.index(b"\x00", document.index(b"\x00", value) + 1) + 1
        else:
            raise InvalidBSON(f"unknown BSON type 0x{kind:02x} at byte {pos} of a document")
        if document[pos + 1 : name_end] == _ID_ELEMENT_NAME:
            return document[pos:value_end]
        pos = value_end
    raise InvalidBSON("a document without an _id")


def document_id(document: bytes) -> Any:
    """The ``_id`` of a BSON document, decoded from its own element alone (MongoDB stores it first):
    whatever else the document holds, invalid UTF-8 included, is not decoded."""
    if document[4:9] == _OBJECT_ID_HEAD:
        return ObjectId(document[9:21])
    element = _id_element(document)
    return bson.decode(struct.pack("<i", len(element) + 5) + element + b"\x00", DECODE_OPTIONS)["_id"]


def document_keys(documents: pa.BinaryArray) -> pa.StringArray:
    """``extjson.document_key`` of each raw document's ``_id``: ObjectIds in bulk, others one by one
    from their ``_id`` element (``document_id``)."""
    heads = pc.binary_slice(documents, 4, _OBJECT_ID_AT[0])
    fast = pc.equal(heads, pa.scalar(_OBJECT_ID_HEAD, pa.binary()))
    if not pc.all(fast).as_py():
        key = extjson.document_key
        return pa.array([key(document_id(document)) for document in documents.to_pylist()], pa.string())
    object_ids = pc.binary_slice(documents, *_OBJECT_ID_AT)  # 12 bytes each, contiguous
    digits = binascii.hexlify(object_ids.buffers()[2].to_pybytes()[: 12 * len(object_ids)])
    hex_ids = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(24), len(object_ids), [None, pa.py_buffer(digits)]
    )
    head, tail = _OBJECT_ID_KEY
    return pc.binary_join_element_wise(head, hex_ids.cast(pa.binary()), tail, b"").cast(pa.string())


def id_elements(documents: pa.BinaryArray) -> pa.BinaryArray:
    """The bytes of each raw document's ``_id`` element: sliced in bulk where every ``_id`` is an
    ObjectId stored first (as MongoDB stores it), found one by one otherwise."""
    heads = pc.binary_slice(documents, 4, _OBJECT_ID_AT[0])
    if pc.all(pc.equal(heads, pa.scalar(_OBJECT_ID_HEAD, pa.binary()))).as_py() is not False:
        return pc.binary_slice(documents, 4, _OBJECT_ID_AT[1])
    return pa.array([_id_element(document) for document in documents.to_pylist()], pa.binary())


def keys_and_documents(
    documents: pa.BinaryArray, fields: CollectionFieldRules | None = None
) -> tuple[pa.Array, pa.Array]:
    """The raw ``key`` and ``after`` columns of documents read from a collection: their own bytes,
    or rewritten by the collection's field rules (``field.exclude.list``, ``field.renames``)."""
    keys = document_keys(documents)  # rules never change _id
    if fields is None:
        return keys, documents
    # per-document work only when the collection has rules
    return keys, pa.array([fields.document(document) for document in documents.to_pylist()], pa.binary())


class SnapshotColumns:
    """Snapshot reads of one collection as Arrow record batches: the hot path of a snapshot.

    Only ``key`` and ``after`` differ per document. ``after`` is the server's batch itself, cut
    into documents without copying (rewritten by elements where field rules change documents); keys of
    ObjectId ``_id``s are built in bulk. The constant columns are built once and sliced.
    """

    def __init__(
        self,
        source_block: dict[str, Any],
        cluster_time: int,
        seq: int,
        fields: CollectionFieldRules | None = None,
        max_rows: int = 50_000,
        event_order: str = "",  # a rename's copy: RENAMED_COPY_ORDER
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
                    "event_order": event_order,
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
