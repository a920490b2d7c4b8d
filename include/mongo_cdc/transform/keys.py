"""Normalised document keys: one key for all ``_id`` values MongoDB takes for the same document.

MongoDB's ``_id`` index compares values, not their BSON encoding: ``1`` (int32),
``NumberLong(1)``, ``1.0`` and ``NumberDecimal("1.00")`` are one ``_id``, and so are ``0`` and
``-0.0``, and every NaN. Only numbers are equal across BSON types; every other type is equal only
to its own kind (strings compare binary, binary data by subtype and bytes, documents field by
field *in order*, with their values compared the same way). A replace may even change the stored
type of an ``_id`` (``1`` -> ``1.0``): the state table keys documents on ``document_key`` so such
a document stays one row.

A key is compact JSON of a tagged value, unambiguous and deterministic:

===================  ==========================================================================
``_id``              key
===================  ==========================================================================
number (any type)    ``["n","<exact value>"]``: an integer as its digits (``"-12"``), any other
                     finite value as ``<digits>E<exponent>`` without trailing zeros (``0.5`` is
                     ``"5E-1"``; a double's exact binary value, so ``0.1`` and
                     ``NumberDecimal("0.1")`` differ, as in MongoDB), ``"NaN"``,
                     ``"Infinity"``, ``"-Infinity"``
string               ``["s","text"]``
ObjectId             ``["oid","<24 hex digits>"]``
date                 ``["date",<ms since epoch>]``
binary               ``["bin",<subtype>,"<base64>"]``
bool, null           ``["b",true]``, ``["null"]``
document             ``["o",[["<name>",<key of value>],...]]`` (field order kept)
array                ``["a",[<key of element>,...]]`` (inside documents: ``_id`` can't be one)
regex, timestamp,    ``["re","<pattern>","<flags>"]``, ``["ts",<t>,<i>]``, ``["code","<js>"]``,
code, min/maxKey     ``["code","<js>",<key of scope>]``, ``["minKey"]``, ``["maxKey"]``
===================  ==========================================================================

Not covered: a collection with a non-simple default collation compares string ``_id``s by it
(e.g. case-insensitively); the keys here compare strings binary, as the simple collation does.
"""

from __future__ import annotations

import base64
import decimal
from typing import Any

import orjson
from bson import DBRef, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.binary import Binary
from bson.code import Code
from bson.datetime_ms import DatetimeMS

from mongo_cdc import extjson

# An integer with up to this many trailing zeros is written out in full; beyond, as 1E<exponent>
# (a Decimal128 may be 1E+6144). Any fixed bound works: it only has to depend on the value alone.
_MAX_PLAIN_EXPONENT = 40


def document_key(value: Any) -> str:
    """The normalised key of an ``_id`` (BSON-decoded with ``extjson.DECODE_OPTIONS``)."""
    if type(value) is ObjectId:  # the common case, ~5x cheaper than the general path
        return '["oid","%s"]' % value
    return orjson.dumps(_tagged(value)).decode()


def _tagged(value: Any) -> list:
    kind = type(value)
    if kind is ObjectId:
        return ["oid", str(value)]
    if kind is str:
        return ["s", value]
    if kind is int or kind is Int64:
        return ["n", str(int(value))]
    if kind is float:
        return ["n", _double_text(value)]
    if kind is Decimal128:
        return ["n", _decimal_text(value.to_decimal())]
    if kind is bool:
        return ["b", value]
    if value is None:
        return ["null"]
    if kind is DatetimeMS:
        return ["date", int(value)]
    if kind is bytes or kind is Binary:
        subtype = value.subtype if kind is Binary else 0
        return ["bin", subtype, base64.b64encode(value).decode()]
    if isinstance(value, dict):
        return ["o", [[name, _tagged(inner)] for name, inner in value.items()]]
    if kind is list:
        return ["a", [_tagged(element) for element in value]]
    if kind is DBRef:  # stored as the document {$ref, $id[, $db], ...}
        return _tagged(value.as_doc().to_dict())
    if kind is Code:
        return ["code", str(value)] if value.scope is None else ["code", str(value), _tagged(value.scope)]
    if kind is Regex:
        regex = orjson.loads(extjson.encode(value))["$regularExpression"]
        return ["re", regex["pattern"], "".join(sorted(regex["options"]))]
    if kind is Timestamp:
        return ["ts", value.time, value.inc]
    if kind is MinKey:
        return ["minKey"]
    if kind is MaxKey:
        return ["maxKey"]
    raise TypeError(
        f"no document key for {kind.__name__} values; decode documents with "
        "bson.decode(data, mongo_cdc.extjson.DECODE_OPTIONS)"
    )


def _double_text(value: float) -> str:
    if value.is_integer() and abs(value) < 2**63:  # the common case: exact, and -0.0 gives "0"
        return str(int(value))
    return _decimal_text(decimal.Decimal(value))  # exact: a double is a finite binary fraction


def _decimal_text(value: decimal.Decimal) -> str:
    if value.is_nan():
        return "NaN"
    if value.is_infinite():
        return "-Infinity" if value.is_signed() else "Infinity"
    if value.is_zero():
        return "0"
    sign, digit_tuple, exponent = value.as_tuple()
    digits = "".join(map(str, digit_tuple))
    significant = digits.rstrip("0")
    exponent += len(digits) - len(significant)
    text = ("-" if sign else "") + significant
    if 0 <= exponent <= _MAX_PLAIN_EXPONENT:
        return text + "0" * exponent
    return f"{text}E{exponent}"
