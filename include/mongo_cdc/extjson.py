"""Fast, lossless MongoDB Extended JSON encoding for the per-document hot path.

The flavour ("mongo-cdc EJSON") is Relaxed Extended JSON v2 with two canonical-mode
exceptions that keep every BSON type recoverable:

* int64 is always ``{"$numberLong": "<n>"}`` (relaxed mode would print a bare number and
  lose the int32/int64 distinction);
* dates are always ``{"$date": {"$numberLong": "<ms>"}}`` (no ISO strings: exact for any year).

int32 is a bare integer, a double a number with a fraction or exponent (``1.0``), NaN and
infinities ``{"$numberDouble": "NaN"}``. Every output of ``encode`` parses back to the same BSON
with ``bson.json_util.loads``. ``from_bson`` writes a document's bytes, which hold what no decoded
value can (the deprecated types, a DBRef-like key set's order): docs/lake-format.md says what of
its text reads back, and with what. ``json_util.dumps`` is ~3x slower than this (see ``make bench``),
so it is only the reference in tests.
"""

from __future__ import annotations

import base64
import math
import struct
from typing import Any

import orjson
from bson import DBRef, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.binary import Binary
from bson.code import Code
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.datetime_ms import DatetimeMS

from mongo_cdc.bson_elements import CONTAINERS, DOCUMENT, FIXED_SIZES, DamagedBson, document_end, value_end_of

# Decode options for every document that goes through ``encode``: dates stay exact
# milliseconds (DatetimeMS) instead of datetimes, which cannot hold years outside 1-9999.
DECODE_OPTIONS: CodecOptions = CodecOptions(datetime_conversion=DatetimeConversion.DATETIME_MS)
# Decode options for reading a document into JSON and typed columns: a string that is not valid
# UTF-8 (MongoDB stores the bytes a driver sends) reads with U+FFFD for each invalid byte instead of
# failing the read. Never encode such a decoded document again: its BSON bytes are the document.
READ_OPTIONS: CodecOptions = DECODE_OPTIONS.with_options(unicode_decode_error_handler="replace")

_OPTIONS = orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATETIME
_read_int32 = struct.Struct("<i").unpack_from
_read_int64 = struct.Struct("<q").unpack_from
_read_double = struct.Struct("<d").unpack_from
_read_timestamp = struct.Struct("<II").unpack_from


def _binary(data: bytes, subtype: int) -> dict:
    return {"$binary": {"base64": base64.b64encode(data).decode(), "subType": f"{subtype:02x}"}}


def _default(value: Any) -> Any:
    # Ordered by how often each type shows up in real collections.
    if isinstance(value, ObjectId):
        return {"$oid": str(value)}
    if isinstance(value, DatetimeMS):
        return {"$date": {"$numberLong": str(int(value))}}
    if isinstance(value, Int64):
        return {"$numberLong": str(int(value))}
    if isinstance(value, Decimal128):
        return {"$numberDecimal": str(value)}
    if isinstance(value, Binary):
        return _binary(bytes(value), value.subtype)
    if isinstance(value, bytes):
        return _binary(value, 0)
    if isinstance(value, Code):  # a str subclass, so it must come before plain dicts and strs
        if value.scope is None:
            return {"$code": str(value)}
        return {"$code": str(value), "$scope": value.scope}
    if isinstance(value, dict):  # dict subclasses (SON) are passed through by orjson
        return dict(value)
    if isinstance(value, DBRef):
        return value.as_doc().to_dict()
    if isinstance(value, Regex):
        flags = value.flags if isinstance(value.flags, str) else _regex_flags(value.flags)
        return {"$regularExpression": {"pattern": value.pattern, "options": flags}}
    if isinstance(value, Timestamp):
        return {"$timestamp": {"t": value.time, "i": value.inc}}
    if isinstance(value, MinKey):
        return {"$minKey": 1}
    if isinstance(value, MaxKey):
        return {"$maxKey": 1}
    if hasattr(value, "pattern") and hasattr(value, "flags"):  # a compiled re.Pattern
        return _default(Regex.from_native(value))
    raise TypeError(f"no Extended JSON encoding for {type(value).__name__}: {value!r}")


def _regex_flags(flags: int) -> str:
    import re

    letters = {
        re.IGNORECASE: "i",
        re.LOCALE: "l",
        re.MULTILINE: "m",
        re.DOTALL: "s",
        re.UNICODE: "u",
        re.VERBOSE: "x",
    }
    return "".join(letter for bit, letter in sorted(letters.items(), key=lambda kv: kv[1]) if flags & bit)


def _replace_non_finite(value: Any) -> Any:
    """orjson writes NaN/Infinity as null; spell them the Extended JSON way first."""
    if isinstance(value, float) and not math.isfinite(value):
        text = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        return {"$numberDouble": text}
    if isinstance(value, dict):
        return {k: _replace_non_finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_non_finite(v) for v in value]
    return value


def _has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(_has_non_finite(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_non_finite(v) for v in value)
    return False


def encode(value: Any) -> bytes:
    """UTF-8 Extended JSON of a decoded BSON value (decoded with ``DECODE_OPTIONS``)."""
    out = orjson.dumps(value, default=_default, option=_OPTIONS)
    # A NaN became "null"; only documents containing null text need the slow check.
    if b"null" in out and _has_non_finite(value):
        out = orjson.dumps(_replace_non_finite(value), default=_default, option=_OPTIONS)
    return out


def encode_str(value: Any) -> str:
    return encode(value).decode()


def from_bson(data: bytes) -> str:
    """The Extended JSON of a BSON document's bytes (the raw zone keeps documents as BSON), read
    element by element from the bytes, never decoded into Python values: a decode cannot keep what
    Python has no type for (``bson`` reads a Symbol as a str, a DBPointer as a DBRef, Undefined as
    None, a sub-document with ``$ref`` and ``$id`` as a DBRef whose keys it reorders, a repeated
    name as one). Every element is written in its order, the deprecated types with their canonical
    wrappers (``$symbol``, ``$dbPointer``, ``$undefined``), every other value as ``encode`` writes
    it decoded. A string or name that is not valid UTF-8 reads with U+FFFD for each invalid byte,
    as with ``READ_OPTIONS``. DamagedBson where the bytes are not a whole document."""
    parts: list[str] = []
    _append_container(data, 0, document_end(data), parts, True)
    return "".join(parts)


def _append_container(data: bytes, start: int, end: int, parts: list[str], is_document: bool) -> None:
    """Append the text of the document (``{"name":value,…}``) or array (``[value,…]``) that is
    ``data[start:end]`` (its length checked by the caller) to ``parts``."""
    append = parts.append
    append("{" if is_document else "[")
    last = end - 1  # the closing NUL
    position = start + 4
    separator = ""
    while position < last:
        kind = data[position]
        name_end = data.find(b"\x00", position + 1, last)
        if name_end < 0:
            raise DamagedBson(f"an element name at byte {position} runs past its document's end")
        if is_document:
            append(separator + _name_text(data[position + 1 : name_end]) + ":")
        else:
            append(separator)
        separator = ","
        value = name_end + 1
        size = FIXED_SIZES.get(kind)
        value_end = value + size if size is not None else value_end_of(data, kind, value, last, position)
        if value_end > last:
            raise DamagedBson(f"the value of an element at byte {position} runs past its document's end")
        if kind in CONTAINERS:
            _append_container(data, value, value_end, parts, kind == DOCUMENT)
        else:
            append(_value_text(kind, data[value:value_end]))
        position = value_end
    append("}" if is_document else "]")


# names repeat from document to document: their JSON text is kept (up to a bound, so that a
# collection of ever new names holds no more memory)
_NAME_TEXTS: dict[bytes, str] = {}
_NAME_TEXTS_MAX = 10_000


def _name_text(name: bytes) -> str:
    text = _NAME_TEXTS.get(name)
    if text is None:
        text = _json_string(name)
        if len(_NAME_TEXTS) < _NAME_TEXTS_MAX:
            _NAME_TEXTS[name] = text
    return text


def _json_string(data: bytes) -> str:
    """A BSON string's bytes (a name, or a value without its length and NUL) as a JSON string."""
    return orjson.dumps(data.decode("utf-8", "replace")).decode()


def _string_value(value: bytes) -> str:
    """The JSON text of a length-prefixed BSON string's value (string, code, symbol)."""
    return _json_string(value[4 : 4 + _read_int32(value)[0] - 1])


def _value_text(kind: int, value: bytes) -> str:
    """The text of one value that is not a document or an array (``value``: its bytes), most
    frequent types first."""
    if kind == 0x02:  # string
        return _json_string(value[4:-1])
    if kind == 0x10:  # int32
        return str(_read_int32(value)[0])
    if kind == 0x01:  # double
        number = _read_double(value)[0]
        if math.isfinite(number):
            return orjson.dumps(number).decode()
        return '{"$numberDouble":"%s"}' % (
            "NaN" if math.isnan(number) else "Infinity" if number > 0 else "-Infinity"
        )
    if kind == 0x07:
        return '{"$oid":"%s"}' % value.hex()
    if kind == 0x12:
        return '{"$numberLong":"%d"}' % _read_int64(value)[0]
    if kind == 0x09:
        return '{"$date":{"$numberLong":"%d"}}' % _read_int64(value)[0]
    if kind == 0x08:
        return "true" if value != b"\x00" else "false"
    if kind == 0x0A:
        return "null"
    if kind == 0x05:  # binary: length, subtype, bytes (the old subtype 2 holds its length again)
        data = value[9:] if value[4] == 2 else value[5:]
        return '{"$binary":{"base64":"%s","subType":"%02x"}}' % (base64.b64encode(data).decode(), value[4])
    if kind == 0x13:
        return '{"$numberDecimal":"%s"}' % Decimal128.from_bid(value)
    if kind == 0x11:  # increment, then seconds
        increment, seconds = _read_timestamp(value)
        return '{"$timestamp":{"t":%d,"i":%d}}' % (seconds, increment)
    if kind == 0x0B:  # pattern and options, two C strings, kept as they are (a decode sorts the options)
        pattern, options = value[:-1].split(b"\x00", 1)
        return '{"$regularExpression":{"pattern":%s,"options":%s}}' % (
            _json_string(pattern),
            _json_string(options),
        )
    if kind == 0x0D:
        return '{"$code":%s}' % _string_value(value)
    if kind == 0x0F:  # total length, the code, the scope
        code_end = 4 + 4 + _read_int32(value, 4)[0]
        scope: list[str] = []
        _append_container(value, code_end, len(value), scope, True)
        return '{"$code":%s,"$scope":%s}' % (_string_value(value[4:code_end]), "".join(scope))
    if kind == 0xFF:
        return '{"$minKey":1}'
    if kind == 0x7F:
        return '{"$maxKey":1}'
    if kind == 0x0E:
        return '{"$symbol":%s}' % _string_value(value)
    if kind == 0x0C:  # the namespace's string, then the ObjectId
        return '{"$dbPointer":{"$ref":%s,"$id":{"$oid":"%s"}}}' % (
            _string_value(value[:-12]),
            value[-12:].hex(),
        )
    return '{"$undefined":true}'  # the one type left: value_end_of refused every unknown one


def document_key(document_id: Any) -> str:
    """Debezium key payload for a document ``_id``: ``{"id": "<Extended JSON of _id>"}``."""
    if type(document_id) is ObjectId:  # the common case, ~5x cheaper than two JSON encodes
        return '{"id":"{\\"$oid\\":\\"%s\\"}"}' % document_id
    return orjson.dumps({"id": encode_str(document_id)}).decode()
