"""Fast, lossless MongoDB Extended JSON encoding for the per-document hot path.

The flavour ("mongo-cdc EJSON") is Relaxed Extended JSON v2 with two canonical-mode
exceptions that keep every BSON type recoverable:

* int64 is always ``{"$numberLong": "<n>"}`` (relaxed mode would print a bare number and
  lose the int32/int64 distinction);
* dates are always ``{"$date": {"$numberLong": "<ms>"}}`` (no ISO strings: exact for any year).

int32 is a bare integer, a double a number with a fraction or exponent (``1.0``), NaN and
infinities ``{"$numberDouble": "NaN"}``. Every output parses back to the same BSON with
``bson.json_util.loads``. ``json_util.dumps`` is ~3x slower than this (see ``make bench``),
so it is only the reference in tests.
"""

from __future__ import annotations

import base64
import math
from typing import Any

import bson
import orjson
from bson import DBRef, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.binary import Binary
from bson.code import Code
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.datetime_ms import DatetimeMS

# Decode options for every document that goes through ``encode``: dates stay exact
# milliseconds (DatetimeMS) instead of datetimes, which cannot hold years outside 1-9999.
DECODE_OPTIONS: CodecOptions = CodecOptions(datetime_conversion=DatetimeConversion.DATETIME_MS)
# Decode options for reading a document into JSON and typed columns: a string that is not valid
# UTF-8 (MongoDB stores the bytes a driver sends) reads with U+FFFD for each invalid byte instead of
# failing the read. Never encode such a decoded document again: its BSON bytes are the document.
READ_OPTIONS: CodecOptions = DECODE_OPTIONS.with_options(unicode_decode_error_handler="replace")

_OPTIONS = orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATETIME


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
    """The Extended JSON of a BSON document's bytes (the raw zone keeps documents as BSON)."""
    return encode_str(bson.decode(data, READ_OPTIONS))


def document_key(document_id: Any) -> str:
    """Debezium key payload for a document ``_id``: ``{"id": "<Extended JSON of _id>"}``."""
    if type(document_id) is ObjectId:  # the common case, ~5x cheaper than two JSON encodes
        return '{"id":"{\\"$oid\\":\\"%s\\"}"}' % document_id
    return orjson.dumps({"id": encode_str(document_id)}).decode()
