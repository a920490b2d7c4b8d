"""Column types of BSON-decoded documents and how a table's columns evolve.

Values are what ``bson.decode(data, extjson.DECODE_OPTIONS)`` gives. A type is a plain string
for scalars, ``("struct", ((name, type), ...))`` or ``("array", element_type)``: hashable,
picklable and JSON-serialisable, so Spark can reduce types and Arrow field metadata can hold them.

============================  =============  ================================================
BSON                          type           Arrow / Delta column
============================  =============  ================================================
ObjectId                      ``objectId``   string, the 24 hex digits
date                          ``date``       timestamp[us, UTC]; years outside 1-9999 -> fallback
Decimal128                    ``decimal``    string, the exact decimal text
binary (any subtype)          ``binary``     binary (the subtype survives only in the document)
int32, int64                  ``long``       int64: integers are always long, so a counter that
                                             ``$inc`` promotes to int64 never conflicts
double                        ``double``     float64 (NaN and infinities kept)
bool                          ``bool``       bool
string                        ``string``     string
embedded document             struct         struct, fields unioned across documents
array                         array          list, element types merged
null                          ``null``       no column until a typed value shows up
empty document                ``fallback``   see below
regex, timestamp, code,
DBRef, min/maxKey             ``fallback``   see below
============================  =============  ================================================

``int`` (int32) is never inferred: it types metadata columns such as ``source.ord``.

Merging the types of one field across documents: null + T = T; struct + struct = the union of
their fields (each merged); array + array = array of the merged element types; any other pair
differs (long vs string, ObjectId vs string, long vs double...) and gives ``fallback``. A
``fallback`` value is its Extended JSON text (``extjson.encode_str``: a string value is quoted),
so no value is ever dropped or silently coerced. Field names are names: a field called
``$numberLong`` is a field like any other.

**Null-typed fields get no column**: a field, nested field or array element type that has only
ever held nulls (or empty arrays, or documents of such) is left out of the schema until a typed
value shows up, so no column is ever retyped from "null". Such values read as null meanwhile.

**Evolution** (``column_survey.survey`` then ``widen``): a table's established columns keep their
type. A batch only *adds*: new top-level fields, new nested struct fields at any depth, element
types of arrays inside new fields. A value that conflicts with its column's established type
(anywhere inside it) is a *conflict*: ``mongo_cdc.transform.table_layout`` moves it, as EJSON
text, to a sibling ``<column>__fallback`` column. Among the batch's own new fields, today's
first-batch rule holds: values that disagree make the (nested) field a ``fallback`` column.

Struct fields of inferred types are in one canonical order (``_id`` first, then by name) so a
merged type does not depend on the order Spark reduces documents in. An evolved table keeps its
fields' order and appends new fields, as Delta's schema merge does.

How a batch of documents is surveyed against these rules is ``column_survey``'s; their Arrow form
is ``arrow_columns``'.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from operator import attrgetter

from bson import DBRef, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.binary import Binary
from bson.code import Code

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

# Arrow timestamps in microseconds hold 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59.999999Z,
# as Spark's and Delta's do.
MIN_TIMESTAMP_MS = -62_135_596_800_000
MAX_TIMESTAMP_MS = 253_402_300_799_999
# DatetimeMS's milliseconds: its slot, read directly (int() is a Python-level call, 5x slower).
date_millis = attrgetter("_value")

# The column type of each scalar class of BSON-decoded values.
# Exact classes (subclasses differ: Code is a str, Binary a bytes, bool an int).
SCALAR_TYPES_BY_CLASS: dict[type, ColumnType] = {
    str: STRING,
    int: LONG,
    Int64: LONG,
    float: DOUBLE,
    bool: BOOL,
    ObjectId: OBJECT_ID,
    Decimal128: DECIMAL,
    bytes: BINARY,
    Binary: BINARY,
    Regex: FALLBACK,
    Timestamp: FALLBACK,
    Code: FALLBACK,
    DBRef: FALLBACK,
    MinKey: FALLBACK,
    MaxKey: FALLBACK,
}


def struct_type(fields: Iterable[tuple[str, ColumnType]]) -> ColumnType:
    """A struct type with its fields in canonical order."""
    return (STRUCT, tuple(sorted(fields, key=_field_order)))


def _field_order(field: tuple[str, ColumnType]) -> tuple[bool, str]:
    return field[0] != "_id", field[0]


def merge_types(left: ColumnType, right: ColumnType) -> ColumnType:
    """The one type that holds values of both types (``FALLBACK`` when they conflict)."""
    if left == right:
        return left
    if left == NULL:
        return right
    if right == NULL:
        return left
    if isinstance(left, tuple) and isinstance(right, tuple) and left[0] == right[0]:
        if left[0] == ARRAY:
            return (ARRAY, merge_types(left[1], right[1]))
        merged = dict(left[1])
        for name, field_type in right[1]:
            merged[name] = merge_types(merged[name], field_type) if name in merged else field_type
        return struct_type(merged.items())
    return FALLBACK


def embeds(
    inner: ColumnType, inner_columns: ColumnType, outer: ColumnType, outer_columns: ColumnType
) -> bool:
    """Whether values stored in a column of type ``inner`` read as values of type ``outer`` (each
    also given under column names): the same type, or ``outer`` with struct fields ``inner`` lacks,
    at any depth (Delta readers read a file's missing nested fields as null). A nested field must
    keep its column name."""
    if inner == outer and inner_columns == outer_columns:
        return True
    if not (isinstance(inner, tuple) and isinstance(outer, tuple)) or inner[0] != outer[0]:
        return False
    if inner[0] == ARRAY:
        return embeds(inner[1], inner_columns[1], outer[1], outer_columns[1])
    fields = {
        name: (column, field, column_type)
        for (name, field), (column, column_type) in zip(outer[1], outer_columns[1], strict=True)
    }
    for (name, field), (column, column_type) in zip(inner[1], inner_columns[1], strict=True):
        if name not in fields or fields[name][0] != column:
            return False
        if not embeds(field, column_type, fields[name][1], fields[name][2]):
            return False
    return True


def lost_in(surveyed: ColumnType, target: ColumnType | None) -> bool:
    """Whether values surveyed as ``surveyed`` (null-typed parts included, as ``survey`` gives them)
    hold a non-null value that has no column without ``target`` but would have one in it: an empty
    array, or a document of nulls, where ``target`` types the field. A layout that leaves out the
    null-typed parts writes such values as null; ``target`` would keep them."""
    if surveyed == NULL or target is None:
        return False
    if without_nulls(surveyed) == NULL:
        return True
    if not (isinstance(surveyed, tuple) and isinstance(target, tuple)) or surveyed[0] != target[0]:
        return False
    if surveyed[0] == ARRAY:
        return lost_in(surveyed[1], target[1])
    fields = dict(target[1])
    return any(lost_in(field, fields.get(name)) for name, field in surveyed[1])


def without_nulls(column: ColumnType) -> ColumnType:
    """``column`` without its null-typed parts (see "Null-typed fields"); NULL if nothing is left."""
    if not isinstance(column, tuple):
        return column
    kind, inner = column
    if kind == ARRAY:
        element = without_nulls(inner)
        return NULL if element == NULL else (ARRAY, element)
    fields = tuple((name, pruned) for name, field in inner if (pruned := without_nulls(field)) != NULL)
    return (STRUCT, fields) if fields else NULL


def widen(
    stored: ColumnType | None,
    stored_columns: ColumnType | None,
    additions: ColumnType,
    name_fields: Callable[[list[str], set[str]], tuple[str, ...]],
) -> tuple[ColumnType, ColumnType]:
    """``stored`` (None: no column yet) with ``additions`` added, as (type, the same type under
    column names); ``stored_columns`` is ``stored`` under column names. Existing fields keep their
    order, types and names; new struct fields follow in canonical order, their null-typed parts
    left out, named by ``name_fields(new field names, column names taken)``."""
    if stored is None:
        added = without_nulls(additions)
        return added, _named(added, name_fields)
    if additions == NULL:
        return stored, stored_columns
    kind = stored[0] if isinstance(stored, tuple) else None
    if kind is None or additions[0] != kind:
        raise ValueError(f"additions {additions!r} do not extend {stored!r}: surveyed against another schema")
    if kind == ARRAY:
        element, element_columns = widen(stored[1], stored_columns[1], additions[1], name_fields)
        return (ARRAY, element), (ARRAY, element_columns)
    added = dict(additions[1])
    fields, columns = [], []
    for (name, field_type), (column, _column_type) in zip(stored[1], stored_columns[1], strict=True):
        field_type, _column_type = widen(field_type, _column_type, added.pop(name, NULL), name_fields)
        fields.append((name, field_type))
        columns.append((column, _column_type))
    new = [(name, t) for name, t in struct_type(added.items())[1] if without_nulls(t) != NULL]
    names = name_fields([name for name, _ in new], {column for column, _ in columns})
    for (name, field_type), column in zip(new, names, strict=True):
        field_type, _column_type = widen(None, None, field_type, name_fields)
        fields.append((name, field_type))
        columns.append((column, _column_type))
    return (STRUCT, tuple(fields)), (STRUCT, tuple(columns))


def _named(column: ColumnType, name_fields: Callable[[list[str], set[str]], tuple[str, ...]]) -> ColumnType:
    """``column`` with every nested struct field under its column name."""
    if not isinstance(column, tuple):
        return column
    kind, inner = column
    if kind == ARRAY:
        return (ARRAY, _named(inner, name_fields))
    names = name_fields([name for name, _ in inner], set())
    return (
        STRUCT,
        tuple((name, _named(field, name_fields)) for name, (_, field) in zip(names, inner, strict=True)),
    )


def fits_type(stored: ColumnType | None, column: ColumnType) -> bool:
    """Whether values of (census) type ``column`` go into a column of type ``stored`` (None: no
    column yet) as they are: no conflict (``column_survey.survey_values``), and no part of them
    lands in a ``fallback`` column, whose values are Extended JSON texts."""
    if column == NULL or stored is None:
        return True
    if not isinstance(column, tuple):
        return column == stored
    if not isinstance(stored, tuple) or stored[0] != column[0]:
        return False
    if column[0] == ARRAY:
        return fits_type(stored[1], column[1])
    fields = dict(stored[1])
    return all(fits_type(fields.get(name), field) for name, field in column[1])


def added_type(stored: ColumnType | None, column: ColumnType) -> ColumnType:
    """What values of type ``column`` add to a column of type ``stored`` that they fit
    (``column_survey.survey_values``'s additions)."""
    if stored is None:
        return column
    if not isinstance(column, tuple):
        return NULL
    if column[0] == ARRAY:
        element = added_type(stored[1], column[1])
        return NULL if element == NULL else (ARRAY, element)
    fields = dict(stored[1])
    added = [
        (name, addition)
        for name, field in column[1]
        if (addition := added_type(fields.get(name), field)) != NULL
    ]
    return struct_type(added) if added else NULL
