"""Column types of BSON-decoded documents, how a table's columns evolve, and their Arrow form.

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

**Evolution** (``survey`` then ``widen``): a table's established columns keep their type. A
batch only *adds*: new top-level fields, new nested struct fields at any depth, element types of
arrays inside new fields. A value that conflicts with its column's established type (anywhere
inside it) is a *conflict*: ``mongo_cdc.transform.table_layout`` moves it, as EJSON text, to a
sibling ``<column>__fallback`` column. Among the batch's own new fields, today's first-batch rule
holds: values that disagree make the (nested) field a ``fallback`` column.

Struct fields of inferred types are in one canonical order (``_id`` first, then by name) so a
merged type does not depend on the order Spark reduces documents in. An evolved table keeps its
fields' order and appends new fields, as Delta's schema merge does.

**Arrow form.** Each Arrow field carries ``{"mongo_cdc.type": <JSON of its type>}`` where a
nested struct is written ``"struct"`` (its own fields carry their own), e.g. ``"objectId"`` or
``["array", "struct"]``: Delta keeps field metadata but has no field for list elements. A field
whose column name differs from the document's field name (``sanitize.field.names``) also
carries ``{"mongo_cdc.field": <the document's name>}``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from functools import cache, reduce
from operator import attrgetter
from typing import Any, NamedTuple

import pyarrow as pa
from bson import DBRef, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.binary import Binary
from bson.code import Code
from bson.datetime_ms import DatetimeMS

from mongo_cdc import extjson

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

TYPE_METADATA = b"mongo_cdc.type"
FIELD_METADATA = b"mongo_cdc.field"

# Arrow timestamps in microseconds hold 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59.999999Z,
# as Spark's and Delta's do.
_MIN_TIMESTAMP_MS = -62_135_596_800_000
_MAX_TIMESTAMP_MS = 253_402_300_799_999

_NONE = type(None)
# DatetimeMS's milliseconds: its slot, read directly (int() is a Python-level call, 5x slower).
_millis = attrgetter("_value")
# Exact classes (subclasses differ: Code is a str, Binary a bytes, bool an int).
_SCALAR_TYPES: dict[type, ColumnType] = {
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


def type_of(value: Any) -> ColumnType:
    """Type of one BSON-decoded value."""
    return column_type([value])


def column_type(values: list) -> ColumnType:
    """The merged type of ``values`` (one field across documents; None for a missing field)."""
    return survey_values(None, values)[0]


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


def survey_values(stored: ColumnType | None, values: list) -> tuple[ColumnType, bool]:
    """What ``values`` of one field need from a column of type ``stored`` (None: no column yet).

    Returns ``(additions, conflict)``. With no column, ``additions`` is the values' merged type
    (``column_type``). With one, it holds only what is new (struct fields not in ``stored``, at
    any depth, each with its merged type; NULL if nothing), and ``conflict`` tells whether some
    value does not fit ``stored`` (a different kind or scalar type anywhere inside it). Works
    column-wise, one pass per nested field, so a batch costs a few list comprehensions per field.
    """
    classes = set(map(type, values))
    classes.discard(_NONE)
    if not classes:
        return NULL, False
    if stored == FALLBACK:
        return NULL, False
    scalars: list[ColumnType] = []
    documents: list[dict] | None = None
    arrays: list[list] | None = None
    for cls in classes:
        scalar = _SCALAR_TYPES.get(cls)
        if scalar is not None:
            scalars.append(scalar)
        elif cls is DatetimeMS:
            scalars.extend(_date_types(values))
        elif issubclass(cls, dict):
            if documents is None:
                documents = [value for value in values if isinstance(value, dict)]
        elif issubclass(cls, list):
            if arrays is None:
                arrays = [value for value in values if isinstance(value, list)]
        else:
            raise TypeError(
                f"no column type for {cls.__name__} values; decode documents with "
                "bson.decode(data, mongo_cdc.extjson.DECODE_OPTIONS)"
            )
    if documents is not None and not all(documents):
        scalars.append(FALLBACK)  # Parquet has no empty groups
        documents = [document for document in documents if document]
    if stored is None:
        kinds = scalars
        if documents:
            kinds.append(_survey_struct({}, documents, new=True)[0])
        if arrays is not None:
            kinds.append((ARRAY, column_type([element for array in arrays for element in array])))
        return reduce(merge_types, kinds), False
    kind = stored[0] if isinstance(stored, tuple) else None
    conflict = any(scalar != stored for scalar in scalars)
    additions: ColumnType = NULL
    if documents:
        if kind == STRUCT:
            additions, conflicting = _survey_struct(dict(stored[1]), documents, new=False)
            conflict = conflict or bool(conflicting)
        else:
            conflict = True
    if arrays is not None:
        if kind == ARRAY:
            elements = [element for array in arrays for element in array]
            element_additions, nested_conflict = survey_values(stored[1], elements)
            additions = NULL if element_additions == NULL else (ARRAY, element_additions)
            conflict = conflict or nested_conflict
        else:
            conflict = True
    return additions, conflict


def _survey_struct(
    stored: dict[str, ColumnType], documents: list[dict] | FieldValues, new: bool
) -> tuple[ColumnType, set[str]]:
    """``survey_values`` of each field of non-empty ``documents``: (additions, conflicting fields)."""
    values_of = documents if isinstance(documents, FieldValues) else FieldValues(documents)
    fields = []
    conflicting = set()
    for name in values_of.names:
        additions, conflict = survey_values(stored.get(name), values_of[name])
        if conflict:
            conflicting.add(name)
        if new or additions != NULL:  # a new struct keeps its null fields: they merge like any other
            fields.append((name, additions))
    return (struct_type(fields) if fields or new else NULL), conflicting


def _date_types(values: list) -> list[ColumnType]:
    millis = [_millis(value) for value in values if type(value) is DatetimeMS]
    in_range = _MIN_TIMESTAMP_MS <= min(millis) and max(millis) <= _MAX_TIMESTAMP_MS
    if in_range:
        return [DATE]
    if any(_MIN_TIMESTAMP_MS <= ms <= _MAX_TIMESTAMP_MS for ms in millis):
        return [DATE, FALLBACK]
    return [FALLBACK]


def fits(column: ColumnType, value: Any) -> bool:
    """Whether ``value`` can go into a column of type ``column`` (else into its fallback sibling)."""
    return not survey_values(column, [value])[1]


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


class FieldValues:
    """The values of each field of ``documents`` (None where a document lacks it), each field's
    list extracted once: a survey and the record batch of the same documents share them. So do
    two tables of the same documents (a snapshot's state and change rows): a survey against the
    same stored fields, and a field's Arrow array of the same types, are made once."""

    def __init__(self, documents: list[dict]) -> None:
        self.documents = documents
        self._values: dict[str, list] = {}
        self._names: set[str] | None = None
        self._surveys: dict[StructFields, BatchTypes] = {}
        self._arrays: dict[tuple[str, ColumnType, pa.DataType], pa.Array] = {}

    def __len__(self) -> int:
        return len(self.documents)

    @property
    def names(self) -> set[str]:
        """Every field name some document has."""
        if self._names is None:
            self._names = set().union(*self.documents)
        return self._names

    def __getitem__(self, name: str) -> list:
        values = self._values.get(name)
        if values is None:
            values = self._values[name] = [document.get(name) for document in self.documents]
        return values

    def survey(self, stored: StructFields) -> BatchTypes:
        """``survey(stored, self)``, made once per ``stored``."""
        surveyed = self._surveys.get(stored)
        if surveyed is None:
            additions, conflicts = _survey_struct(dict(stored), self, new=False)
            surveyed = self._surveys[stored] = BatchTypes(additions, frozenset(conflicts))
        return surveyed

    def arrow(self, name: str, column: ColumnType, arrow: pa.DataType) -> pa.Array:
        """``to_arrow`` of field ``name``'s values (which fit ``column``), made once per types."""
        key = (name, column, arrow)
        array = self._arrays.get(key)
        if array is None:
            array = self._arrays[key] = to_arrow(self[name], column, arrow)
        return array

    def split(self, name: str, column: ColumnType, arrow: pa.DataType) -> tuple[pa.Array, pa.Array]:
        """Field ``name``'s values as (a column of type ``column``, its fallback sibling): a value that
        does not fit ``column`` is null in the first and its Extended JSON text in the second."""
        typed, texts = [], []
        for value in self[name]:
            if value is None or fits(column, value):
                typed.append(value)
                texts.append(None)
            else:
                typed.append(None)
                texts.append(fallback_text(value))
        return to_arrow(typed, column, arrow), pa.array(texts, type=pa.string())

    def typed(self, name: str) -> bool:
        """Whether some document holds a value of field ``name`` that is not null-typed."""
        return without_nulls(column_type(self[name])) != NULL


class BatchTypes(NamedTuple):
    """What a batch of documents needs from a table's stored fields (``survey``); merge the
    surveys of a batch's parts (Spark partitions) with ``merge``."""

    additions: ColumnType  # a struct of the new (nested) fields and their merged types, or NULL
    conflicts: frozenset[str]  # top-level fields with a value that does not fit its column

    def merge(self, other: BatchTypes) -> BatchTypes:
        return BatchTypes(merge_types(self.additions, other.additions), self.conflicts | other.conflicts)


NO_CHANGES = BatchTypes(NULL, frozenset())


def survey(stored: StructFields, documents: list[dict] | FieldValues) -> BatchTypes:
    """The additions and conflicting top-level fields of ``documents`` against ``stored``."""
    if not documents:
        return NO_CHANGES
    return (FieldValues(documents) if isinstance(documents, list) else documents).survey(stored)


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


# -- Arrow -------------------------------------------------------------------------------------

_ARROW_SCALARS = {
    INT: pa.int32(),
    LONG: pa.int64(),
    DOUBLE: pa.float64(),
    BOOL: pa.bool_(),
    STRING: pa.string(),
    OBJECT_ID: pa.string(),
    DATE: pa.timestamp("us", tz="UTC"),
    DECIMAL: pa.string(),
    BINARY: pa.binary(),
    FALLBACK: pa.string(),
}
LIST_ELEMENT = "element"  # the name Delta (delta-rs) gives list elements


def arrow_type(column: ColumnType, fields: ColumnType | None = None) -> pa.DataType:
    """The Arrow type of ``column`` (a type under column names), its fields carrying their
    metadata; ``fields`` is the same type under the document's names where they differ."""
    if not isinstance(column, tuple):
        if column not in _ARROW_SCALARS:
            raise ValueError(f"no Arrow type for {column!r}: a null-typed field has no column")
        return _ARROW_SCALARS[column]
    kind, inner = column
    if kind == ARRAY:
        element = arrow_type(inner, None if fields is None else fields[1])
        return pa.list_(pa.field(LIST_ELEMENT, element))
    sources = inner if fields is None else fields[1]
    return pa.struct(
        [
            arrow_field(name, field_type, field_name, field_source)
            for (name, field_type), (field_name, field_source) in zip(inner, sources, strict=True)
        ]
    )


def arrow_field(
    name: str, column: ColumnType, field_name: str | None = None, fields: ColumnType | None = None
) -> pa.Field:
    """An Arrow field for a column of type ``column``, with the ``mongo_cdc.type`` metadata (and
    ``mongo_cdc.field`` when the document's ``field_name`` differs from ``name``)."""
    metadata = {TYPE_METADATA: json.dumps(_level_type(column), separators=(",", ":")).encode()}
    if field_name is not None and field_name != name:
        metadata[FIELD_METADATA] = field_name.encode()
    return pa.field(name, arrow_type(column, fields), metadata=metadata)


def _level_type(column: ColumnType) -> Any:
    """``column`` as JSON with nested structs written as just ``"struct"``."""
    if not isinstance(column, tuple):
        return column
    kind, inner = column
    return STRUCT if kind == STRUCT else [ARRAY, _level_type(inner)]


class ArrowColumn(NamedTuple):
    """One Arrow field read back: its name and type, and the document's name and type."""

    column: str
    column_type: ColumnType  # nested fields under their column names
    field: str
    field_type: ColumnType  # nested fields under the document's names
    metadata: dict[bytes, bytes]


def fields_from_arrow(arrow: pa.Schema | pa.StructType | Iterable[pa.Field]) -> tuple[ArrowColumn, ...]:
    """The fields of an Arrow schema or struct, typed from their ``mongo_cdc.type`` metadata.

    ValueError naming the field if one lacks it: the table was not written by mongo-cdc.
    """
    return tuple(_column_from_arrow(field) for field in arrow)


def _column_from_arrow(field: pa.Field) -> ArrowColumn:
    metadata = dict(field.metadata or {})
    if TYPE_METADATA not in metadata:
        raise ValueError(
            f"column {field.name!r} has no {TYPE_METADATA.decode()} field metadata: this table was not "
            "written by mongo-cdc (or by a version before the Delta layout); rebuild it from raw"
        )
    column, source = _type_from_arrow(json.loads(metadata[TYPE_METADATA]), field.type, field.name)
    name = metadata.get(FIELD_METADATA, field.name.encode()).decode()
    return ArrowColumn(field.name, column, name, source, metadata)


def _type_from_arrow(level: Any, arrow: pa.DataType, where: str) -> tuple[ColumnType, ColumnType]:
    if level == STRUCT and pa.types.is_struct(arrow):
        read = fields_from_arrow(arrow)
        return (
            (STRUCT, tuple((c.column, c.column_type) for c in read)),
            (STRUCT, tuple((c.field, c.field_type) for c in read)),
        )
    if isinstance(level, list) and level[:1] == [ARRAY] and pa.types.is_list(arrow):
        column, source = _type_from_arrow(level[1], arrow.value_type, where)
        return (ARRAY, column), (ARRAY, source)
    if isinstance(level, str) and _ARROW_SCALARS.get(level) == arrow:
        return level, level
    raise ValueError(
        f"column {where!r}: {TYPE_METADATA.decode()} {level!r} does not describe its type {arrow}"
    )


# -- values ------------------------------------------------------------------------------------


def fallback_text(value: Any) -> str:
    """A value as a fallback column holds it: its Extended JSON text."""
    return extjson.encode_str(value)


def to_arrow(values: list, column: ColumnType, arrow: pa.DataType | None = None) -> pa.Array:
    """``values`` (which fit ``column``, a type under the document's names; None is null) as an
    Arrow array of type ``arrow`` (``arrow_type(column)`` under other names: a zero-copy view)."""
    prepare = _preparer(column)
    if prepare is not None:
        values = [None if value is None else prepare(value) for value in values]
    array = pa.array(values, type=arrow_type(column))
    return array if arrow is None or arrow == array.type else array.view(arrow)


@cache  # a table has few types
def _preparer(column: ColumnType) -> Callable[[Any], Any] | None:
    """A function turning a value into one ``pa.array`` takes for ``column``; None if it takes
    the value as it is."""
    if not isinstance(column, tuple):
        return _SCALAR_PREPARERS.get(column)
    if column[0] == ARRAY:
        element = _preparer(column[1])
        return None if element is None else _array_preparer(element)
    prepared = tuple((name, p) for name, field in column[1] if (p := _preparer(field)) is not None)
    return _struct_preparer(prepared) if prepared else None


def _array_preparer(element: Callable[[Any], Any]) -> Callable[[list], list]:
    return lambda array: [None if value is None else element(value) for value in array]


def _struct_preparer(fields: tuple[tuple[str, Callable[[Any], Any]], ...]) -> Callable[[dict], dict]:
    def prepare(document: dict) -> dict:
        prepared = dict(document)
        for name, prepare_field in fields:
            value = document.get(name)
            if value is not None:
                prepared[name] = prepare_field(value)
        return prepared

    return prepare


_SCALAR_PREPARERS: dict[ColumnType, Callable[[Any], Any]] = {
    OBJECT_ID: str,
    DATE: lambda value: _millis(value) * 1000,
    DECIMAL: str,
    FALLBACK: fallback_text,
}
