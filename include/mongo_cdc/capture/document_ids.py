"""A BSON document's ``_id``, read from its own element: nothing else in the document is decoded.

A document's key comes from its ``_id`` element alone (``document_id``), so whatever else it holds
(invalid UTF-8 included) is never decoded; ObjectIds stored first, as MongoDB stores nearly every
``_id``, are keyed in bulk (``document_keys``).
"""

from __future__ import annotations

import binascii
import struct
from typing import Any

import bson
import pyarrow as pa
import pyarrow.compute as pc
from bson import ObjectId
from bson.errors import InvalidBSON

from mongo_cdc import extjson
from mongo_cdc.extjson import DECODE_OPTIONS

# A document whose first element is an ObjectId named _id (as MongoDB stores nearly every one): its
# key is built from the 12 bytes after this head, in bulk, with no decoding.
_OBJECT_ID_HEAD = b"\x07_id\x00"
_OBJECT_ID_AT = (4 + len(_OBJECT_ID_HEAD), 4 + len(_OBJECT_ID_HEAD) + 12)
# extjson.document_key of an ObjectId, around its hex digits
_OBJECT_ID_KEY = (b'{"id":"{\\"$oid\\":\\"', b'\\"}"}')
# BSON sizes and lengths: little-endian int32s, read in place (``unpack_int32(data, offset)[0]``)
unpack_int32 = struct.Struct("<i").unpack_from


# Sizes of BSON values by type byte: fixed, or how a value's leading int32 counts its bytes
_FIXED_SIZES = {0x01: 8, 0x06: 0, 0x07: 12, 0x08: 1, 0x09: 8, 0x0A: 0, 0x10: 4, 0x11: 8, 0x12: 8,
                0x13: 16, 0x7F: 0, 0xFF: 0}  # fmt: skip
_SELF_COUNTING = frozenset((0x03, 0x04, 0x0F))  # documents, arrays, code with scope
# + what follows the counted bytes: strings, JavaScript code, symbols; binaries (their subtype byte)
# and DBPointers (their ObjectId)
_COUNTED_AFTER_LENGTH = {0x02: 4, 0x0D: 4, 0x0E: 4, 0x05: 5, 0x0C: 16}
ID_ELEMENT_NAME = b"_id\x00"


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
            value_end = value + unpack_int32(document, value)[0]
        elif kind in _COUNTED_AFTER_LENGTH:
            value_end = value + unpack_int32(document, value)[0] + _COUNTED_AFTER_LENGTH[kind]
        elif kind == 0x0B:  # regular expression: pattern and options, two C strings
            value_end = document.index(b"\x00", document.index(b"\x00", value) + 1) + 1
        else:
            raise InvalidBSON(f"unknown BSON type 0x{kind:02x} at byte {pos} of a document")
        if document[pos + 1 : name_end] == ID_ELEMENT_NAME:
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
