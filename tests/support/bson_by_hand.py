"""BSON built byte by byte, and corpora of values and documents of every type and edge case.

A value is ``(type byte, value bytes)``: how it stands in a document after its name. pymongo's
``bson`` cannot write the deprecated types (Symbol, DBPointer, Undefined) and would change some
bits a document may hold (a decode and encode turns them into other types), so the corpora are
built here; ``round_trips`` says which values pymongo would keep. ``VALUES`` holds one value per
type and edge case (a document of all: ``corpus_document``); ``CASES`` one document per case
(``documents``), and ``INVALID_UTF8_CASES`` strings that are not valid UTF-8.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import bson
from bson import DatetimeConversion, json_util
from bson.code import Code
from bson.codec_options import CodecOptions
from bson.json_util import JSONOptions
from bson.raw_bson import RawBSONDocument
from bson.son import SON

from mongo_cdc.bson_elements import ARRAY, DOCUMENT, document_bytes, element_bytes

Value = tuple[int, bytes]
Elements = list[tuple[str | bytes, Value]]

# reading these documents raw: dates (some beyond datetime's years) as milliseconds
RAW = CodecOptions(document_class=RawBSONDocument, datetime_conversion=DatetimeConversion.DATETIME_MS)


def int32(value: int) -> bytes:
    return struct.pack("<i", value)


def string(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return int32(len(data) + 1) + data + b"\x00"


def cstring(text: str) -> bytes:
    return text.encode() + b"\x00"


def _name(name: str | bytes) -> bytes:
    return name.encode() if isinstance(name, str) else name


def document(elements: Iterable[tuple[str | bytes, Value]]) -> bytes:
    return document_bytes(element_bytes(kind, _name(name), value) for name, (kind, value) in elements)


def embedded(elements: Iterable[tuple[str | bytes, Value]]) -> Value:
    return DOCUMENT, document(elements)


def array(values: Iterable[Value]) -> Value:
    return ARRAY, document((b"%d" % i, value) for i, value in enumerate(values))


def binary(subtype: int, data: bytes) -> Value:
    if subtype == 2:  # the old binary subtype holds its own length again
        data = int32(len(data)) + data
    return 0x05, int32(len(data)) + bytes([subtype]) + data


def code_with_scope(code: str, scope: Iterable[tuple[str | bytes, Value]]) -> Value:
    body = string(code) + document(scope)
    return 0x0F, int32(len(body) + 4) + body


def double_bits(bits: int) -> Value:
    return 0x01, struct.pack("<Q", bits)


def raw(elements: Iterable[tuple[str | bytes, Value]]) -> RawBSONDocument:
    """A document to hand pymongo as it is (an insert, an update's operators)."""
    return RawBSONDocument(document(elements))


def round_trips(value: Value) -> bool:
    """Whether pymongo's bson decodes and encodes the value back to the same bytes."""
    data = document([("v", value)])
    try:
        return bson.encode(bson.decode(data)) == data
    except (bson.errors.InvalidBSON, bson.errors.InvalidDocument, TypeError):
        return False


OBJECT_ID = bytes.fromhex("65a1b2c3d4e5f60718293a4b")
SYMBOL = (0x0E, string("a symbol"))
DBPOINTER = (0x0C, string("db.collection") + OBJECT_ID)
UNDEFINED = (0x06, b"")

DOCUMENT_FIELDS = [("a", (0x10, int32(1))), ("$dollar", (0x0A, b"")), ("dot.ted", SYMBOL), ("", UNDEFINED)]
ARRAY_VALUES = [(0x10, int32(1)), SYMBOL, embedded([("x", UNDEFINED)]), array([DBPOINTER])]

# every type, the deprecated ones, and values whose bits a decode may not keep
VALUES: dict[str, Value] = {
    "double": (0x01, struct.pack("<d", 1.5)),
    "negative zero": (0x01, struct.pack("<d", -0.0)),
    "infinity": (0x01, struct.pack("<d", float("-inf"))),
    "nan with a payload": double_bits(0x7FF0_0000_0000_0BAD),
    "negative signalling nan": double_bits(0xFFF0_0000_0000_0001),
    "string": (0x02, string("é名 \u2028")),
    "empty string": (0x02, string("")),
    "document": embedded(DOCUMENT_FIELDS),
    "dbref-like document": embedded(
        [
            ("$ref", (0x02, string("not-a-dbref"))),
            ("$id", (0x07, OBJECT_ID)),
            ("$banana", (0x02, string("peel"))),
        ]
    ),
    "empty document": embedded([]),
    "array": array(ARRAY_VALUES),
    "empty array": array([]),
    **{
        f"binary subtype {subtype}": binary(subtype, b"\x00\x01bin")
        for subtype in (0, 1, 2, 3, 4, 5, 6, 7, 8, 0x80)
    },
    "undefined": UNDEFINED,
    "object id": (0x07, OBJECT_ID),
    "true": (0x08, b"\x01"),
    "false": (0x08, b"\x00"),
    "date before 1970": (0x09, struct.pack("<q", -62_135_596_800_001)),
    "null": (0x0A, b""),
    "regex": (0x0B, cstring("^a.*b$") + cstring("imsx")),
    "dbpointer": DBPOINTER,
    "code": (0x0D, string("function () { return 1; }")),
    "symbol": SYMBOL,
    "code with scope": code_with_scope("function () { return x; }", [("x", SYMBOL)]),
    "int32": (0x10, int32(-(2**31))),
    "timestamp": (0x11, struct.pack("<II", 7, 1_700_000_000)),
    "int64": (0x12, struct.pack("<q", 2**40)),
    "decimal128": (0x13, bson.Decimal128("1.10").bid),
    "decimal128 non-canonical": (0x13, bytes(14) + b"\x00\x70"),  # a coefficient past 10^34: zero
    "decimal128 nan with a payload": (0x13, b"\x2a" + bytes(14) + b"\x7c"),
    "minkey": (0xFF, b""),
    "maxkey": (0x7F, b""),
}

# field names MongoDB accepts that look like something else (the fold cannot reach a dotted one:
# change events do not say which dots are names)
NAMES = ["$dollar", "dot.ted", "", "é名", "$ref", "$id", "$db"]

# array elements long enough that mongod logs a cut array as a truncation, not as the whole array
LONG = [(0x02, string(f"{i:02d}" + "x" * 40)) for i in range(12)]


def corpus_document(document_id: int) -> list[tuple[str, Value]]:
    """The elements of a document holding every value of the corpus under its name, the odd names,
    a DBRef's key set at the top level, and arrays to truncate (``long``, ``nested.long``)."""
    return [
        ("_id", (0x10, int32(document_id))),
        *VALUES.items(),
        *((f"named {name}" if name.startswith("$") else name, SYMBOL) for name in NAMES),
        ("$ref", (0x02, string("not-a-dbref"))),
        ("$id", VALUES["object id"]),
        ("$banana", (0x02, string("peel"))),
        ("long", array(LONG)),
        ("nested", embedded([("long", array(LONG)), ("tail", UNDEFINED)])),
    ]


def _double(value: float) -> Value:
    return 0x01, struct.pack("<d", value)


def _int32_value(value: int) -> Value:
    return 0x10, int32(value)


_OID = bytes.fromhex("0123456789abcdef01234567")

# (name, the elements after _id and "case") of each document of ``documents``
CASES: tuple[tuple[str, Elements], ...] = (
    ("double", [("v", _double(1.5)), ("negative_zero", _double(-0.0))]),
    ("nan_payloads", [("v", double_bits(0x7FF8000000000123)), ("signalling", double_bits(0x7FF0000000000001)),
                      ("negative", double_bits(0xFFF8000000000000)), ("infinity", _double(float("inf")))]),
    ("unicode_string", [("v", (0x02, string("café ☕ 名前")))]),
    ("embedded", [("v", embedded([("a", _int32_value(1))])), ("empty", embedded([]))]),
    ("array", [("v", array([_int32_value(1), (0x02, string("x"))])), ("empty", array([]))]),
    ("binaries", [(f"b{subtype}", binary(subtype, data)) for subtype, data in (
        (0, b"\x00\x01"), (1, b"f"), (2, b"ab"), (3, bytes(range(16))), (4, bytes(range(16, 32))),
        (5, bytes(16)), (6, b"enc"), (7, b"\x01col"), (8, b"sens"), (9, b"\x03\x00"), (0x80, b"user"))]),
    ("undefined", [("v", UNDEFINED)]),
    ("object_id", [("v", (0x07, _OID))]),
    ("booleans", [("t", (0x08, b"\x01")), ("f", (0x08, b"\x00"))]),
    ("dates", [("v", (0x09, struct.pack("<q", 1_700_000_000_123))),
               ("far_future", (0x09, struct.pack("<q", 253_402_300_800_000 * 3))),
               ("before_epoch", (0x09, struct.pack("<q", -62_135_596_800_001)))]),
    ("null", [("v", (0x0A, b""))]),
    ("regex", [("v", (0x0B, cstring("^a.*b$") + cstring("imsx")))]),
    ("db_pointer", [("v", (0x0C, string("db.collection") + _OID))]),
    ("code", [("v", (0x0D, string("function () { return 1; }")))]),
    ("symbol", [("v", SYMBOL)]),
    ("code_with_scope", [("v", code_with_scope("x + y", [("x", _int32_value(1))]))]),
    ("int32", [("v", _int32_value(-7))]),
    ("timestamp", [("v", (0x11, struct.pack("<II", 5, 1_700_000_000)))]),
    ("int64", [("v", (0x12, struct.pack("<q", 2**40)))]),
    ("decimals", [("v", (0x13, struct.pack("<QQ", 100, 0x303C000000000000))),  # 1.00
                  # coefficient over 34 digits: non-canonical, read as zero
                  ("non_canonical", (0x13, struct.pack("<QQ", 0xFFFFFFFFFFFFFFFF, 0x3041FFFFFFFFFFFF))),
                  ("nan_payload", (0x13, struct.pack("<QQ", 12, 0x7C00000000000000)))]),
    ("min_max_keys", [("min", (0xFF, b"")), ("max", (0x7F, b""))]),
    ("field_names", [("a.b", _int32_value(1)), ("", _int32_value(2)), ("名前", _int32_value(3)),
                     ("$dollar", _int32_value(4)),
                     ("nested", embedded([("$inner", _int32_value(5)), ("x.y", _int32_value(6))]))]),
    ("dbref_like", [("$ref", (0x02, string("not-a-dbref"))), ("$id", (0x07, _OID)),
                    ("$banana", (0x02, string("peel")))]),
    ("nested_dbref_like", [("v", embedded([("$ref", (0x02, string("x"))), ("$id", _int32_value(1)),
                                           ("$extra", _int32_value(2))]))]),
)  # fmt: skip

# strings that are not valid UTF-8: a lone continuation byte, a cut sequence, an overlong one
INVALID_UTF8_CASES: tuple[tuple[str, Elements], ...] = (
    # fields of their own: typed string, struct and list columns
    ("invalid_utf8", [("text", (0x02, string(b"caf\xc3"))), ("ok", (0x02, string("fine"))),
                      ("inner", embedded([("w", (0x02, string(b"\xff\xfe")))])),
                      ("texts", array([(0x02, string(b"\xc0\xaf"))]))]),
)  # fmt: skip


def documents(cases: tuple[tuple[str, Elements], ...], first_id: int) -> list[RawBSONDocument]:
    """One document per case, ``_id`` from ``first_id`` on (MongoDB keeps ``_id`` first)."""
    return [
        RawBSONDocument(document([("_id", _int32_value(first_id + index)), ("case", (0x02, string(name))),
                                  *elements]), RAW)
        for index, (name, elements) in enumerate(cases)
    ]  # fmt: skip


# the options every ``json_util.loads`` of our Extended JSON takes: dates as exact milliseconds
LOADS_OPTIONS = JSONOptions(datetime_conversion=DatetimeConversion.DATETIME_MS)


class _Deprecated(NamedTuple):
    """A value ``bson`` has no Python type for (Symbol, DBPointer, Undefined): its element's type
    and value bytes."""

    kind: int
    value: bytes


def bson_of_extjson(text: str) -> bytes:
    """The BSON of an Extended JSON document as the specification reads it: ``json_util.loads``
    (``LOADS_OPTIONS``) but for two things it reads otherwise. The deprecated types' canonical
    wrappers (``$symbol``, ``$dbPointer``, ``$undefined``), which it reads as a str, a DBRef and
    None, are kept as the types they name; and an object with ``$ref`` and ``$id`` keys, which it
    reads as a DBRef (whose ``$ref``, ``$id`` and ``$db`` ``bson.encode`` writes first), is the
    document it is, its keys in their order (a DBRef is a convention, not a BSON type)."""
    return document(_elements(json.loads(text, object_pairs_hook=_deprecated_or_loaded)))


def _deprecated_or_loaded(pairs: list[tuple[str, Any]]) -> Any:
    keys = [key for key, _ in pairs]
    if keys == ["$symbol"]:
        return _Deprecated(0x0E, string(pairs[0][1]))
    if keys == ["$undefined"] and pairs[0][1] is True:
        return _Deprecated(0x06, b"")
    if keys == ["$dbPointer"]:  # its {"$ref", "$id"} was read as a document already
        pointer = dict(pairs[0][1])
        return _Deprecated(0x0C, string(pointer["$ref"]) + pointer["$id"].binary)
    if "$ref" in keys:
        return SON(pairs)
    return json_util.object_pairs_hook(pairs, LOADS_OPTIONS)


def _elements(values: Mapping[str, Any]) -> Elements:
    return [(name, _value(value)) for name, value in values.items()]


def _value(value: Any) -> Value:
    if isinstance(value, _Deprecated):
        return value.kind, value.value
    if isinstance(value, Mapping):
        return embedded(_elements(value))
    if isinstance(value, list):
        return array(_value(item) for item in value)
    if isinstance(value, Code) and value.scope is not None:
        return code_with_scope(str(value), _elements(value.scope))
    element = bson.encode({"v": value})[4:-1]  # type byte, "v\0", the value
    return element[0], element[3:]
