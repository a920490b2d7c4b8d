"""The lossless survey: what BSON-decoded documents need from a table's columns.

``survey`` gives a batch's additions (new fields at any depth, with their merged types) and its
conflicts (top-level fields holding a value that does not fit their column) against a table's
stored fields, by the rules of ``column_types``. ``FieldValues`` holds each field's values of the
documents, extracted once for the survey and the batch's Arrow arrays (``arrow_columns``). The fast
path (``bson_columns``) takes a census of BSON bytes instead, for the documents it holds exactly.
"""

from __future__ import annotations

from functools import reduce
from typing import Any, NamedTuple

import pyarrow as pa
from bson.datetime_ms import DatetimeMS

from mongo_cdc.transform.arrow_columns import fallback_text, to_arrow
from mongo_cdc.transform.column_types import (
    ARRAY,
    DATE,
    FALLBACK,
    MAX_TIMESTAMP_MS,
    MIN_TIMESTAMP_MS,
    NULL,
    SCALAR_TYPES_BY_CLASS,
    STRUCT,
    ColumnType,
    StructFields,
    date_millis,
    merge_types,
    struct_type,
    without_nulls,
)

_NONE = type(None)


def type_of(value: Any) -> ColumnType:
    """Type of one BSON-decoded value."""
    return column_type([value])


def column_type(values: list) -> ColumnType:
    """The merged type of ``values`` (one field across documents; None for a missing field)."""
    return survey_values(None, values)[0]


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
        scalar = SCALAR_TYPES_BY_CLASS.get(cls)
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
    millis = [date_millis(value) for value in values if type(value) is DatetimeMS]
    in_range = MIN_TIMESTAMP_MS <= min(millis) and max(millis) <= MAX_TIMESTAMP_MS
    if in_range:
        return [DATE]
    if any(MIN_TIMESTAMP_MS <= ms <= MAX_TIMESTAMP_MS for ms in millis):
        return [DATE, FALLBACK]
    return [FALLBACK]


def fits(column: ColumnType, value: Any) -> bool:
    """Whether ``value`` can go into a column of type ``column`` (else into its fallback sibling)."""
    return not survey_values(column, [value])[1]


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
