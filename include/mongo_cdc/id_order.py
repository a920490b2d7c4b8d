"""MongoDB's order of ``_id`` values, from their normalised keys (``transform.keys``).

The order is the ``_id`` index's (the simple collation): MinKey < null < numbers (by value across
int, long, double and decimal; NaN first) < strings (UTF-8 bytes) < documents (field by field: the
value's type, the name, the value; a prefix first) < arrays < binary (length, subtype, bytes) <
ObjectId < bool < date < timestamp < regex < code < code with scope < MaxKey.

Used on both sides: by the verification's ranges (``verify.key_order``) and by a filtered
re-snapshot's ``_id`` range (``id_ranges``), which Spark's executors apply in the state MERGE, so it
imports only what an executor has (bson, orjson).
"""

from __future__ import annotations

import base64
import decimal
from typing import Any

import orjson

from mongo_cdc.transform.keys import document_key

# MongoDB's canonical type order (BSONType::canonicalizeBSONType), by normalised key tag
TYPE_RANK = {"minKey": 1, "null": 2, "n": 3, "s": 4, "o": 5, "a": 6, "bin": 7, "oid": 8, "b": 9,
              "date": 10, "ts": 11, "re": 12, "code": 13, "maxKey": 127}  # fmt: skip
_CODE_WITH_SCOPE_RANK = 14
_NAN = decimal.Decimal(0)


def order_of_key(key: str) -> tuple:
    """A value that sorts normalised keys as MongoDB sorts their ``_id``s."""
    if key.startswith('["oid","'):  # the common case: ObjectIds order as their hex digits
        return (8, key[8:32])
    return _order(orjson.loads(key))


def _order(tagged: list) -> tuple:
    tag = tagged[0]
    if tag == "n":
        text = tagged[1]
        return (3, 0, _NAN) if text == "NaN" else (3, 1, decimal.Decimal(text))
    if tag == "s":
        return (4, tagged[1].encode("utf-8"))
    if tag == "o":
        return (
            5,
            tuple((_order(value)[0], name.encode("utf-8"), _order(value)) for name, value in tagged[1]),
        )
    if tag == "a":
        return (6, tuple(_order(element) for element in tagged[1]))
    if tag == "bin":
        data = base64.b64decode(tagged[2])
        return (7, len(data), tagged[1], data)
    if tag == "code" and len(tagged) == 3:
        return (_CODE_WITH_SCOPE_RANK, tagged[1], _order(tagged[2]))
    return (TYPE_RANK[tag], *tagged[1:])


def order_of_value(value: Any) -> tuple:
    """``order_of_key`` of a decoded ``_id`` value."""
    return order_of_key(document_key(value))
