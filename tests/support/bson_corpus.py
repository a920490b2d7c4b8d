"""Hand-made BSON documents MongoDB stores but pymongo cannot write from Python values: one document per
BSON type and edge case (deprecated types, NaN payloads, non-canonical decimals, every binary subtype,
odd field names), and strings that are not valid UTF-8. Built byte by byte, inserted as
``RawBSONDocument``s, so the server keeps exactly these bytes."""

from __future__ import annotations

import struct

from bson import DatetimeConversion, ObjectId
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument

# reading these documents raw: dates (some beyond datetime's years) as milliseconds
RAW = CodecOptions(document_class=RawBSONDocument, datetime_conversion=DatetimeConversion.DATETIME_MS)

_OID = ObjectId("0123456789abcdef01234567").binary


def document(*elements: bytes) -> bytes:
    body = b"".join(elements)
    return int32(len(body) + 5) + body + b"\x00"


def element(kind: int, name: str | bytes, value: bytes) -> bytes:
    name_bytes = name.encode() if isinstance(name, str) else name
    return bytes([kind]) + name_bytes + b"\x00" + value


def string(data: bytes) -> bytes:
    return int32(len(data) + 1) + data + b"\x00"


def binary(subtype: int, data: bytes) -> bytes:
    return int32(len(data)) + bytes([subtype]) + data


def int32(value: int) -> bytes:
    return struct.pack("<i", value)


def code_with_scope(code: bytes, scope: bytes) -> bytes:
    return int32(4 + len(code) + len(scope)) + code + scope


def _id(value: int) -> bytes:
    return element(0x10, "_id", int32(value))


# (name, the elements after _id) of each case
CASES: tuple[tuple[str, tuple[bytes, ...]], ...] = (
    ("double", (element(0x01, "v", struct.pack("<d", 1.5)),
                element(0x01, "negative_zero", struct.pack("<d", -0.0)))),
    ("nan_payloads", (element(0x01, "v", struct.pack("<Q", 0x7FF8000000000123)),
                      element(0x01, "signalling", struct.pack("<Q", 0x7FF0000000000001)),
                      element(0x01, "negative", struct.pack("<Q", 0xFFF8000000000000)),
                      element(0x01, "infinity", struct.pack("<d", float("inf"))))),
    ("unicode_string", (element(0x02, "v", string("café ☕ 名前".encode())),)),
    ("embedded", (element(0x03, "v", document(element(0x10, "a", int32(1)))),
                  element(0x03, "empty", document()))),
    ("array", (element(0x04, "v", document(element(0x10, "0", int32(1)),
                                           element(0x02, "1", string(b"x")))),
               element(0x04, "empty", document()))),
    ("binaries", tuple(element(0x05, f"b{subtype}", binary(subtype, data)) for subtype, data in (
        (0, b"\x00\x01"), (1, b"f"), (2, int32(2) + b"ab"), (3, bytes(range(16))),
        (4, bytes(range(16, 32))), (5, bytes(16)), (6, b"enc"), (7, b"\x01col"), (8, b"sens"),
        (9, b"\x03\x00"), (0x80, b"user")))),
    ("undefined", (element(0x06, "v", b""),)),
    ("object_id", (element(0x07, "v", _OID),)),
    ("booleans", (element(0x08, "t", b"\x01"), element(0x08, "f", b"\x00"))),
    ("dates", (element(0x09, "v", struct.pack("<q", 1_700_000_000_123)),
               element(0x09, "far_future", struct.pack("<q", 253_402_300_800_000 * 3)),
               element(0x09, "before_epoch", struct.pack("<q", -62_135_596_800_001)))),
    ("null", (element(0x0A, "v", b""),)),
    ("regex", (element(0x0B, "v", b"^a.*b$\x00imsx\x00"),)),
    ("db_pointer", (element(0x0C, "v", string(b"db.collection") + _OID),)),
    ("code", (element(0x0D, "v", string(b"function () { return 1; }")),)),
    ("symbol", (element(0x0E, "v", string(b"a symbol")),)),
    ("code_with_scope", (element(0x0F, "v", code_with_scope(string(b"x + y"),
                                                            document(element(0x10, "x", int32(1))))),)),
    ("int32", (element(0x10, "v", int32(-7)),)),
    ("timestamp", (element(0x11, "v", struct.pack("<II", 5, 1_700_000_000)),)),
    ("int64", (element(0x12, "v", struct.pack("<q", 2**40)),)),
    ("decimals", (element(0x13, "v", struct.pack("<QQ", 100, 0x303C000000000000)),  # 1.00
                  # coefficient over 34 digits: non-canonical, read as zero
                  element(0x13, "non_canonical", struct.pack("<QQ", 0xFFFFFFFFFFFFFFFF, 0x3041FFFFFFFFFFFF)),
                  element(0x13, "nan_payload", struct.pack("<QQ", 12, 0x7C00000000000000)))),
    ("min_max_keys", (element(0xFF, "min", b""), element(0x7F, "max", b""))),
    ("field_names", (element(0x10, "a.b", int32(1)), element(0x10, "", int32(2)),
                     element(0x10, "名前", int32(3)), element(0x10, "$dollar", int32(4)),
                     element(0x03, "nested", document(element(0x10, "$inner", int32(5)),
                                                      element(0x10, "x.y", int32(6)))))),
    ("dbref_like", (element(0x02, "$ref", string(b"not-a-dbref")), element(0x07, "$id", _OID),
                    element(0x02, "$banana", string(b"peel")))),
    ("nested_dbref_like", (element(0x03, "v", document(element(0x02, "$ref", string(b"x")),
                                                      element(0x10, "$id", int32(1)),
                                                      element(0x10, "$extra", int32(2)))),)),
)  # fmt: skip

# strings that are not valid UTF-8: a lone continuation byte, a cut sequence, an overlong one
INVALID_UTF8_CASES: tuple[tuple[str, tuple[bytes, ...]], ...] = (
    # fields of their own: typed string, struct and list columns
    ("invalid_utf8", (element(0x02, "text", string(b"caf\xc3")), element(0x02, "ok", string(b"fine")),
                      element(0x03, "inner", document(element(0x02, "w", string(b"\xff\xfe")))),
                      element(0x04, "texts", document(element(0x02, "0", string(b"\xc0\xaf")))))),
)  # fmt: skip


def documents(cases: tuple[tuple[str, tuple[bytes, ...]], ...], first_id: int) -> list[RawBSONDocument]:
    """One document per case, ``_id`` from ``first_id`` on (MongoDB keeps ``_id`` first)."""
    return [
        RawBSONDocument(
            document(_id(first_id + index), element(0x02, "case", string(name.encode())), *elements), RAW
        )
        for index, (name, elements) in enumerate(cases)
    ]
