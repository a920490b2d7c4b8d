"""A change stream read raw: its events as ``RawBSONDocument``s, decoded only as far as a pull needs.

Change events are read as ``RawBSONDocument``s (``open_change_stream``): only an event's top level
is decoded, on first use, and ``fullDocument``, ``fullDocumentBeforeChange`` and ``updatedFields``
stay the bytes the server sent (``bson_bytes``), which the raw rows (``raw_rows``) keep.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import bson
from bson import Timestamp
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient
from pymongo.change_stream import ClusterChangeStream

from mongo_cdc.capture.document_ids import unpack_int32
from mongo_cdc.extjson import DECODE_OPTIONS


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
        and unpack_int32(raw, _TOKEN_TEXT_AT - 4)[0] == len(raw) - _TOKEN_TEXT_AT - 1
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


def op_time_of(token: dict) -> Timestamp:
    """The op-time of a resume token."""
    cluster_time = token_cluster_time(token)
    return Timestamp(cluster_time >> 32, cluster_time & 0xFFFFFFFF)


def op_time_position(client: MongoClient, op_time: Timestamp) -> dict:
    """A resume token at ``op_time``: the high-water mark a change stream opened there reports before
    reading anything. A stream resumed after it reads the events of ``op_time`` on."""
    with client.watch(start_at_operation_time=op_time, batch_size=0) as stream:
        return stream.resume_token
