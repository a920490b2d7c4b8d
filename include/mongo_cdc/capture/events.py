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
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

import bson
import numpy as np
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
from mongo_cdc.lake import (
    RAW_SCHEMA,
    SOURCE_TYPE,
    TRANSACTION_TYPE,
    UPDATE_DESCRIPTION_TYPE,
    hour_partition,
    pack_cluster_time,
)

CONNECTOR = "mongodb"
VERSION = f"mongo-cdc-{__version__}"

# change-stream operationType -> Debezium op
DATA_OPERATIONS = {"insert": "c", "update": "u", "replace": "u", "delete": "d"}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class DecodedRawDocument(RawBSONDocument):
    """A ``RawBSONDocument`` the C decoder made from bytes it checked already (a reply's events,
    an event's embedded documents): made without ``RawBSONDocument``'s own Python checks of its
    options and size, which cost more than decoding the event (one per event and per document in
    it)."""

    __slots__ = ()

    def __init__(self, bson_bytes: bytes, codec_options: Any = None) -> None:
        self._RawBSONDocument__raw = bson_bytes
        self._RawBSONDocument__inflated_doc = None
        self._RawBSONDocument__codec_options = codec_options or RAW_EVENT_OPTIONS

    def top_level(self) -> dict[str, Any]:
        """The decoded top level itself, not a copy (a change stream decoded it already, to read the
        resume token): for the one owner of an event read from a stream, which may change it."""
        decoded = self._RawBSONDocument__inflated_doc
        return decoded if decoded is not None else dict(self.items())


# Change events as RawBSONDocuments: the top level decodes on first use (dates as exact milliseconds),
# every embedded document stays a RawBSONDocument over the server's bytes.
RAW_EVENT_OPTIONS = DECODE_OPTIONS.with_options(document_class=DecodedRawDocument)


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


# the small documents of an event's metadata, decoded with the top level (the resume token and the
# namespace, which every event has, have quicker ways: ``_resume_token``, ``_namespace``)
_METADATA_DOCUMENTS = ("to", "updateDescription")


def event_fields(event: RawBSONDocument) -> dict[str, Any]:
    """A raw change event's top level as a dict (its ``_id``, ``ns``, ``to`` and ``updateDescription``
    too): ``fullDocument``, ``fullDocumentBeforeChange``, ``documentKey``, ``updatedFields`` and
    ``lsid`` stay RawBSONDocuments over the server's bytes. The stream decoded the top level already
    (to read the resume token): its ``items`` are taken as they are, so no dict lookup goes through
    RawBSONDocument's per-access path, and not copied when the event is a ``DecodedRawDocument``:
    the stream's events have no other owner."""
    fields = event.top_level() if isinstance(event, DecodedRawDocument) else dict(event.items())
    fields["_id"] = _resume_token(bson_bytes(fields["_id"]))  # a large _id's token may be a view
    ns = fields.get("ns")
    if ns is not None:
        fields["ns"] = _namespace(ns.raw)
    for name in _METADATA_DOCUMENTS:
        value = fields.get(name)
        if value is not None:
            fields[name] = dict(value.items())
    return fields


_TOKEN_HEAD = b"\x02_data\x00"
_TOKEN_TEXT_AT = 4 + len(_TOKEN_HEAD) + 4


def _resume_token(raw: bytes) -> dict[str, Any]:
    """A resume token's BSON as a dict: ``{"_data": <hex>}`` sliced out of it (every token since
    MongoDB 4.2 is that one string), any other layout decoded."""
    # the string's length (with its NUL) is all that follows it but the document's NUL
    if (
        raw.startswith(_TOKEN_HEAD, 4)
        and _document_size(raw, _TOKEN_TEXT_AT - 4)[0] == len(raw) - _TOKEN_TEXT_AT - 1
    ):
        return {"_data": raw[_TOKEN_TEXT_AT:-2].decode()}
    return bson.decode(raw, DECODE_OPTIONS)


@lru_cache(maxsize=1024)
def _namespace(raw: bytes) -> dict[str, Any]:
    """An event's ``ns`` (``{db, coll}``), decoded once per namespace: a batch's events share a few.
    Read-only: the same dict serves every event of its namespace."""
    return bson.decode(raw, DECODE_OPTIONS)


def bson_bytes(document: Any) -> bytes:
    """The BSON of a document: its own bytes when it was read raw, else encoded again.

    Since pymongo 4.18 a raw document of 4 KB or more is a read-only ``memoryview`` of the reply it
    came in; its bytes are copied out here. Raw rows are bytes: ``pa.array`` over those memoryviews
    kept every one's memory (a pull of 64 KB documents grew by each batch it landed, to 820 MiB).
    """
    # the exact type first: the check against RawBSONDocument, an ABC, is slow
    if type(document) is DecodedRawDocument or isinstance(document, RawBSONDocument):
        raw = document.raw
        return raw if type(raw) is bytes else bytes(raw)
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

    def values(
        self,
        db: str,
        collection: str,
        cluster_time: int,
        ts_ms: int,
        snapshot: bool,
        lsid: str | None = None,
        txn_number: int | None = None,
        wall_time: int | None = None,
    ) -> tuple[Any, ...]:
        """The ``source`` block's values, in ``SOURCE_TYPE``'s order (``SOURCE_NAMES``)."""
        return (
            VERSION,
            CONNECTOR,
            self.name,
            ts_ms,
            snapshot,
            db,
            self.rs,
            collection,
            cluster_time & 0xFFFFFFFF,  # ord
            lsid,
            txn_number,
            # Debezium's common source fields: sequence is for connectors with a multi-part position
            # (never set by its MongoDB connector); ts_us/ts_ns are ts_ms at finer units
            None,  # sequence
            ts_ms * 1000,
            ts_ms * 1_000_000,
            wall_time,
        )

    def block(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The ``source`` block as a dict (arguments as ``values``)."""
        return dict(zip(SOURCE_NAMES, self.values(*args, **kwargs), strict=True))


def event_position(change: dict) -> tuple[int, int]:
    """(packed cluster time, source ts_ms) of a change event; ts_ms is its wall time if it has one."""
    ts = change["clusterTime"]
    wall = change.get("wallTime")
    return pack_cluster_time(ts.time, ts.inc), int(wall) if wall is not None else ts.time * 1000


class RawRow(NamedTuple):
    """A raw row as a pull gathers it (``RAW_SCHEMA`` less ``batch_seq`` and ``hour``, which a table of
    rows gets in bulk: ``raw_rows_table``)."""

    # the key payload, or the BSON of the event's documentKey, keyed in bulk with the others
    key: str | bytes
    op: str | None
    ts_ms: int
    before: bytes | None
    after: bytes | None
    update_description: dict[str, Any] | None
    source: tuple[Any, ...]  # SourceInfo.values
    cluster_time: int
    event_order: str
    transaction: dict[str, Any] | None = None

    @property
    def source_ts_ms(self) -> int:
        return self.source[_SOURCE_TS_MS]


def change_rows(
    change: dict,
    source: SourceInfo,
    tombstones: bool,
    fields: CollectionFieldRules | None = None,
    transaction: dict[str, Any] | None = None,
) -> list[RawRow]:
    """Raw rows for one insert/update/replace/delete change-stream event, read raw
    (``open_change_stream``): its documents land as the server's bytes (``fields``: its collection's
    ``field.exclude.list`` / ``field.renames``, which rewrite them; ``transaction``: the event's
    transaction block)."""
    op = DATA_OPERATIONS[change["operationType"]]
    cluster_time, source_ts_ms = event_position(change)
    wall = change.get("wallTime")
    lsid = change.get("lsid")
    txn_number = change.get("txnNumber")
    after = change.get("fullDocument")
    if after is not None:
        after = bson_bytes(after)
    # only with a pre-image capture.mode, and never for inserts
    before = change.get("fullDocumentBeforeChange")
    if before is not None:
        before = bson_bytes(before)
    description = change.get("updateDescription")
    update_description = _update_description(description) if description is not None else None
    if fields is not None:
        after, before, update_description = apply_field_rules(fields, after, before, update_description)
    ns = change["ns"]
    row = RawRow(
        bson_bytes(change["documentKey"]),  # keyed in bulk with the batch's others (raw_rows_table)
        op,
        now_ms(),
        before,
        after,
        update_description,
        source.values(
            ns["db"],
            ns["coll"],
            cluster_time,
            source_ts_ms,
            False,
            extjson.encode_str(bson.decode(bson_bytes(lsid), DECODE_OPTIONS)) if lsid is not None else None,
            int(txn_number) if txn_number is not None else None,
            int(wall) if wall is not None else None,
        ),
        cluster_time,
        change["_id"]["_data"],
        transaction,
    )
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


def tombstone_of(row: RawRow) -> RawRow:
    """The tombstone after a delete's row: same key, every value column null."""
    return RawRow(row.key, None, row.ts_ms, None, None, None, row.source, row.cluster_time, row.event_order)


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


def raw_row(row: dict[str, Any]) -> RawRow:
    """A raw row given as a dict of ``RAW_SCHEMA``'s columns (``source`` a dict too) as a ``RawRow``."""
    source = row.get("source")
    return RawRow(
        row["key"],
        row.get("op"),
        row.get("ts_ms"),  # type: ignore[arg-type]
        row.get("before"),
        row.get("after"),
        row.get("updateDescription"),
        tuple(source.get(name) for name in SOURCE_NAMES) if source is not None else None,  # type: ignore[arg-type]
        row["cluster_time"],
        row["event_order"],
        row.get("transaction"),
    )


def rows_to_table(rows: list[dict[str, Any]], seq: int) -> pa.Table:
    """Raw rows given as dicts (``raw_row``) as a table of batch ``seq``."""
    return raw_rows_table([raw_row(row) for row in rows], seq)


def raw_rows_table(rows: list[RawRow], seq: int) -> pa.Table:
    """Raw rows as a table of batch ``seq`` (``lake.HISTORY_SEQ`` for backfilled history), built
    column by column from the rows' columns (``zip``), the ``source`` struct from its fields'."""
    count = len(rows)
    keys, ops, ts_ms, befores, afters, descriptions, sources, cluster_times, orders, transactions = (
        zip(*rows, strict=True) if rows else ((),) * len(RawRow._fields)
    )
    columns = [
        _key_column(keys),
        pa.array(ops, pa.string()),
        pa.array(ts_ms, pa.int64()),
        pa.array(befores, pa.binary()),
        pa.array(afters, pa.binary()),
        _struct_column(descriptions, UPDATE_DESCRIPTION_TYPE),
        _source_column(sources),
        pa.array(cluster_times, pa.int64()),
        pa.array(orders, pa.string()),
        _struct_column(transactions, TRANSACTION_TYPE),
        pa.repeat(pa.scalar(seq, pa.int64()), count),
        pa.array([hour_partition(cluster_time) for cluster_time in cluster_times], pa.string()),
    ]
    return pa.Table.from_arrays(columns, schema=RAW_SCHEMA)


def _key_column(keys: tuple[str | bytes, ...]) -> pa.Array:
    """The ``key`` column: key payloads as they are, documentKeys' BSON keyed (``document_keys``),
    in bulk when they all are."""
    if all(isinstance(key, bytes) for key in keys) and keys:
        return document_keys(pa.array(keys, pa.binary()))
    key = extjson.document_key
    return pa.array([raw if isinstance(raw, str) else key(document_id(raw)) for raw in keys], pa.string())


def _struct_column(values: tuple[dict[str, Any] | None, ...], arrow_type: pa.StructType) -> pa.Array:
    if all(value is None for value in values):
        return pa.nulls(len(values), arrow_type)
    return pa.array(values, arrow_type)


def _source_column(sources: tuple[tuple[Any, ...] | None, ...]) -> pa.Array:
    """The ``source`` struct from each field's values (converting it row by row dominated a pull's CPU)."""
    if any(source is None for source in sources):
        blocks = [dict(zip(SOURCE_NAMES, source, strict=True)) if source else None for source in sources]
        return pa.array(blocks, SOURCE_TYPE)
    fields = zip(*sources, strict=True) if sources else ((),) * len(SOURCE_NAMES)
    children = [pa.array(values, field.type) for values, field in zip(fields, SOURCE_TYPE, strict=True)]
    return pa.StructArray.from_arrays(children, fields=list(SOURCE_TYPE))


SOURCE_NAMES = tuple(field.name for field in SOURCE_TYPE)
_SOURCE_TS_MS = SOURCE_NAMES.index("ts_ms")
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
    starts = _leading_id_starts(batch)
    offsets = pa.array(_walked_starts(batch) if starts is None else starts, pa.int32())
    return pa.BinaryArray.from_buffers(
        pa.binary(), len(offsets) - 1, [None, offsets.buffers()[1], pa.py_buffer(batch)]
    )


def _walked_starts(batch: bytes) -> list[int]:
    """The documents' offsets in ``batch`` and its end, one document's size after another."""
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
    return offsets


def _leading_id_starts(batch: bytes) -> np.ndarray | None:
    """``_walked_starts`` in bulk (a Python step per document cost 0.17 s per million) where every
    document starts with an ``_id`` element, as MongoDB stores them, and holds no other field named
    ``_id``: the positions 5 bytes before an ``_id`` name are then the starts, each the end of the one
    before. None (walked one by one) where not: most such batches are told by their first document."""
    end = len(batch)
    name = _ID_ELEMENT_NAME
    if end < 9 or batch[5:9] != name or batch.find(name, 9, _document_size(batch, 0)[0]) != -1:
        return None
    data = np.frombuffer(batch, np.uint8)
    starts = np.flatnonzero(data[5 : end - 3] == name[0])  # a bytes' item is an int
    for at in range(1, len(name)):
        starts = starts[data[starts + 5 + at] == name[at]]
    sizes = data[starts[:, None] + np.arange(4)].view("<i4").ravel()
    ends = starts + sizes
    if (sizes < 5).any() or ends[-1] != end or (ends[:-1] != starts[1:]).any():
        return None
    return np.append(starts, end)


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
