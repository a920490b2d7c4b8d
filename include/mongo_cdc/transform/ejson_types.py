"""Column types of documents in mongo-cdc Extended JSON, and the conversion of values to them.

Each value (parsed with ``orjson.loads`` from the EJSON text of ``mongo_cdc.extjson``) gets a
type; the types of one collection's documents are merged into one. A type is a plain string
for scalars, ``("struct", ((name, type), ...))`` or ``("array", element_type)``: hashable,
picklable and JSON-serialisable, so Spark can reduce them and the lake can store them.

============================  =============  ===========================================
BSON                          type           Spark column
============================  =============  ===========================================
ObjectId                      ``objectId``   string, the 24 hex digits
date                          ``date``       timestamp (UTC); years outside 1-9999 -> fallback
Decimal128                    ``decimal``    string, the exact decimal text
binary (any subtype)          ``binary``     binary (the subtype survives only in ``__doc``)
int32                         ``int``        int
int64                         ``long``       long
double                        ``double``     double (NaN and infinities kept)
bool                          ``bool``       boolean
string                        ``string``     string
embedded document             struct         struct, fields unioned across documents
array                         array          array, element types merged
null (no other value seen)    ``null``       string (always null)
empty document                ``fallback``   see below
regex, timestamp, min/maxKey,
code, DBRef, anything else    ``fallback``   see below
============================  =============  ===========================================

Merging the types of one field across documents: null + T = T; int + long = long;
struct + struct = the union of their fields (each merged); array + array = array of the merged
element types; any other pair differs (int vs string, ObjectId vs string, long vs double...) and
gives ``fallback``. A ``fallback`` column is a string holding each value's EJSON text (a string
value is quoted), so no value is ever dropped or silently coerced.

A document whose first field name starts with ``$`` is taken for an EJSON type wrapper: the
known ones above are typed, every other one (including real documents with ``$``-prefixed field
names, and DBRefs) is ``fallback``, which keeps it intact.

Struct fields are kept in one canonical order (``_id`` first, then by name) so that the merged
type does not depend on the order in which Spark reduces documents.
"""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Iterable
from functools import reduce
from typing import Any

import orjson

NULL = "null"
INT = "int"
LONG = "long"
DOUBLE = "double"
BOOL = "bool"
STRING = "string"
OBJECT_ID = "objectId"
DATE = "date"
DECIMAL = "decimal"
BINARY = "binary"
FALLBACK = "fallback"

STRUCT = "struct"
ARRAY = "array"

ColumnType = str | tuple  # a scalar name, (STRUCT, fields) or (ARRAY, element type)
StructFields = tuple[tuple[str, ColumnType], ...]

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
# Spark timestamps hold 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59.999999Z.
_MIN_TIMESTAMP_MS = -62_135_596_800_000
_MAX_TIMESTAMP_MS = 253_402_300_799_999
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)

_WRAPPER_TYPES = {
    "$oid": OBJECT_ID,
    "$date": DATE,
    "$numberLong": LONG,
    "$numberDecimal": DECIMAL,
    "$numberDouble": DOUBLE,
    "$binary": BINARY,
}


def struct_type(fields: Iterable[tuple[str, ColumnType]]) -> ColumnType:
    """A struct type with its fields in canonical order."""
    return (STRUCT, tuple(sorted(fields, key=_field_order)))


def _field_order(field: tuple[str, ColumnType]) -> tuple[bool, str]:
    return field[0] != "_id", field[0]


def type_of(value: Any) -> ColumnType:
    """Type of one parsed EJSON value."""
    if value is None:
        return NULL
    if isinstance(value, bool):  # before int: bool is an int subclass
        return BOOL
    if isinstance(value, int):
        return INT if _INT32_MIN <= value <= _INT32_MAX else LONG
    if isinstance(value, float):
        return DOUBLE
    if isinstance(value, str):
        return STRING
    if isinstance(value, list):
        return (ARRAY, reduce(merge_types, map(type_of, value), NULL))
    if isinstance(value, dict):
        return _type_of_embedded(value)
    raise TypeError(f"not a parsed JSON value: {type(value).__name__}")


def type_of_document(document: dict) -> ColumnType:
    """Type of a top-level document: always a struct (its fields are the table's columns)."""
    return struct_type((name, type_of(value)) for name, value in document.items())


def _type_of_embedded(document: dict) -> ColumnType:
    if not document:
        return FALLBACK  # Parquet has no empty groups
    first = next(iter(document))
    if first.startswith("$"):
        wrapped = _WRAPPER_TYPES.get(first, FALLBACK) if len(document) == 1 else FALLBACK
        if wrapped == DATE and not _MIN_TIMESTAMP_MS <= _date_millis(document) <= _MAX_TIMESTAMP_MS:
            return FALLBACK
        return wrapped
    return type_of_document(document)


def merge_types(left: ColumnType, right: ColumnType) -> ColumnType:
    """The one type that holds values of both types (``FALLBACK`` when they conflict)."""
    if left == right:
        return left
    if left == NULL:
        return right
    if right == NULL:
        return left
    if {left, right} == {INT, LONG}:
        return LONG
    if isinstance(left, tuple) and isinstance(right, tuple) and left[0] == right[0]:
        if left[0] == ARRAY:
            return (ARRAY, merge_types(left[1], right[1]))
        merged = dict(left[1])
        for name, field_type in right[1]:
            merged[name] = merge_types(merged[name], field_type) if name in merged else field_type
        return struct_type(merged.items())
    return FALLBACK


def to_column_value(value: Any, column_type: ColumnType) -> Any:
    """A parsed EJSON value as the Python value Spark expects for ``column_type``.

    Structs become tuples in field order; ``column_type`` must hold the value's own type
    (it is the merge of all values' types).
    """
    if value is None:
        return None
    if column_type == FALLBACK:
        return orjson.dumps(value).decode()
    if isinstance(column_type, tuple):
        kind, inner = column_type
        if kind == ARRAY:
            return [to_column_value(element, inner) for element in value]
        return tuple(to_column_value(value.get(name), field_type) for name, field_type in inner)
    return _SCALAR_CONVERTERS[column_type](value)


def _date_millis(wrapper: dict) -> int:
    return int(wrapper["$date"]["$numberLong"])


def _timestamp(wrapper: dict) -> dt.datetime:
    # Timezone-aware on purpose: pyspark converts naive datetimes with the worker's local zone.
    return _EPOCH + dt.timedelta(milliseconds=_date_millis(wrapper))


_SCALAR_CONVERTERS = {
    INT: lambda value: value,
    LONG: lambda value: value if isinstance(value, int) else int(value["$numberLong"]),
    DOUBLE: lambda value: value if isinstance(value, float) else float(value["$numberDouble"]),
    BOOL: lambda value: value,
    STRING: lambda value: value,
    OBJECT_ID: lambda value: value["$oid"],
    DATE: _timestamp,
    DECIMAL: lambda value: value["$numberDecimal"],
    BINARY: lambda value: base64.b64decode(value["$binary"]["base64"]),
}


def type_to_json(column_type: ColumnType) -> Any:
    """``column_type`` as plain JSON (tuples become lists)."""
    return orjson.loads(orjson.dumps(column_type))


def type_from_json(data: Any) -> ColumnType:
    """Inverse of ``type_to_json``."""
    if isinstance(data, str):
        return data
    kind, inner = data
    if kind == ARRAY:
        return (ARRAY, type_from_json(inner))
    return (STRUCT, tuple((name, type_from_json(field_type)) for name, field_type in inner))
