"""Typed Arrow columns straight from BSON bytes, without decoding a value into Python.

The raw zone keeps documents as BSON, end to end in one buffer of an Arrow binary column.
``FastDocuments`` walks that buffer with numpy, one vectorised step per element position across all
documents at once, and takes an exact census of each field's BSON types (at every depth, array
elements included). A document takes this fast path only if the census shows every value it holds is
one the columns of ``mongo_cdc.transform.column_types`` hold exactly as the lossless path
(``bson.decode`` then ``arrow_columns.to_arrow``) would:

===================  ==========================================================================
fast                 double (NaN, infinities and -0.0 kept bit for bit), string (valid UTF-8),
                     embedded document (non-empty), array, binary (subtypes other than 2),
                     ObjectId, bool, date (years 1-9999), null, int32, int64
lossless path        everything else: Decimal128, regex, timestamp, code, DBRef, symbol,
                     undefined, min/max key, an empty document, a date outside 1-9999, a string
                     that is not valid UTF-8, a duplicate field name, a field name that is not
                     valid UTF-8, damaged BSON; and every document holding a value of a field (or
                     array element) whose values in this batch's fast documents disagree in type
                     (long vs double, bool vs long, a scalar next to a document or an array...)
===================  ==========================================================================

So the fast documents' types merge without a ``fallback`` anywhere; the lossless documents are
surveyed and written as before (``TableLayout``), and both surveys merge. Nothing is coerced: an
int32 in a long column is the same integer, and a double never meets an integer in one column.
A column of a layout that is ``fallback`` for a field (or that the census's type does not fit:
``survey_type``) sends that field's documents to the lossless path too.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa

from mongo_cdc.bson_elements import (
    ARRAY,
    BINARY,
    BOOL,
    CODE,
    CODE_WITH_SCOPE,
    DATE,
    DB_POINTER,
    DOCUMENT,
    DOUBLE,
    FIXED_SIZES,
    INT32,
    INT64,
    NULL,
    OBJECT_ID,
    REGEX,
    STRING,
    SYMBOL,
)
from mongo_cdc.transform import arrow_columns, column_survey, column_types
from mongo_cdc.transform.bson_buffer import BsonBuffer

MISSING = 0  # no element (a field a document lacks), as a kind
_NAME_BYTES_MAX = 64  # a document with a longer field name takes the lossless path (bounds _keys' memory)
# a little-endian word's first n bytes, for n of 0 to 8
_LOW_BYTES_MASKS = np.array([(1 << (8 * count)) - 1 for count in range(9)], np.uint64)

# Column type of each kind the fast path holds exactly.
_FAST_KINDS: dict[int, column_types.ColumnType] = {
    DOUBLE: column_types.DOUBLE,
    STRING: column_types.STRING,
    BINARY: column_types.BINARY,
    OBJECT_ID: column_types.OBJECT_ID,
    BOOL: column_types.BOOL,
    DATE: column_types.DATE,
    INT32: column_types.LONG,
    INT64: column_types.LONG,
}

# Value size of fixed-size kinds; -1 where the size is read from the value (or not a kind).
_FIXED_SIZES_BY_KIND = np.full(256, -1, np.int64)
for _kind, _size in FIXED_SIZES.items():
    _FIXED_SIZES_BY_KIND[_kind] = _size
# Kinds whose value starts with its int32 length, and what to add to it.
_LENGTH_PREFIXED = {STRING: 4, CODE: 4, SYMBOL: 4, DOCUMENT: 0, ARRAY: 0, CODE_WITH_SCOPE: 0,
                    BINARY: 5, DB_POINTER: 16}  # fmt: skip

# each byte's two hex digits, as an ObjectId's text has them
HEX_DIGITS = np.frombuffer(b"".join(b"%02x" % byte for byte in range(256)), np.uint8).reshape(256, 2)


class Values(NamedTuple):
    """Values at one path (a field, or array elements), one per slot; kind MISSING where absent."""

    kind: np.ndarray  # uint8 BSON type
    at: np.ndarray  # offset of the value in the buffer
    size: np.ndarray  # its size in bytes
    root: np.ndarray  # the document (index into the batch) holding it

    def __len__(self) -> int:
        return len(self.kind)


class Level(NamedTuple):
    """The elements of some containers (documents or arrays), in order within each container."""

    container: np.ndarray  # index of the container holding the element
    offset: np.ndarray  # where the element starts (its type byte)
    first: np.ndarray  # whether it is its container's first
    documents: bool  # the containers are documents (else arrays)
    key: np.ndarray  # index into ``names`` (documents only)
    names: list[bytes]
    values: Values


class FastDocuments:
    """The census of a batch of BSON documents and, for those the fast path holds, their columns.

    ``data``: the documents end to end; ``starts``: each one's offset. ``fast`` is a boolean mask of
    the documents that take the fast path; ``types`` their merged type (a struct, or NULL), which
    holds no ``fallback`` anywhere."""

    def __init__(self, data: np.ndarray, starts: np.ndarray, stored: column_types.StructFields = ()) -> None:
        """``stored``: the table's typed columns (``TableLayout.stored_fields``); a document with a value
        that does not fit its column, or that goes to a ``fallback`` column, takes the lossless path."""
        self.buffer = BsonBuffer(data)
        starts = starts.astype(np.int64)
        stored_types = dict(stored)
        slow = np.zeros(len(starts), bool)
        everything = np.arange(len(starts))
        while True:  # a document marked slow changes no fast document's type: a second pass confirms
            chosen = everything[~slow]
            count = len(chosen)
            self.documents = Values(
                np.full(count, DOCUMENT, np.uint8), starts[chosen], np.zeros(count, np.int64), chosen
            )
            marked = np.zeros(len(starts), bool)
            self.levels: dict[tuple[str, ...], Level] = {}  # each path's walk, for columns and texts
            level = self.levels[()] = self._level(self.documents, marked, documents=True)
            self.top = self._fields(level, count, marked)
            census = {
                name: self._census(field, marked, (name,), stored_types.get(name))
                for name, field in self.top.items()
            }
            if not marked.any():
                break
            slow |= marked
        self.fast = ~slow
        self.indices = chosen
        self.census = census  # each top-level field's type in the fast documents
        additions = [
            (name, added)
            for name, column in census.items()
            if (added := column_types.added_type(stored_types.get(name), column)) != column_types.NULL
        ]
        self.survey = column_survey.BatchTypes(
            column_types.struct_type(additions) if additions else column_types.NULL, frozenset()
        )

    def __len__(self) -> int:
        return len(self.indices)

    # -- walking

    def _level(self, containers: Values, bad: np.ndarray, documents: bool) -> Level:
        """The elements of ``containers`` (documents or arrays, all present); ``bad`` marks the roots
        of damaged ones (their elements are then incomplete: the root leaves the fast path)."""
        buffer = self.buffer
        size = len(buffer.data)
        count = len(containers.at)
        starts = containers.at
        lengths = np.zeros(count, np.int64)
        fits = starts + 5 <= size
        lengths[fits] = buffer.int32(starts[fits])
        broken = ~fits | (lengths < 5) | (starts + lengths > size)
        ends = starts + np.where(broken, 5, lengths)
        cursor = starts + 4
        live = np.flatnonzero(~broken)
        parts: list[tuple[np.ndarray, ...]] = []
        position = 0  # of the elements in their containers
        while live.size:
            at = cursor[live]
            end = ends[live]
            kind = buffer.data[np.minimum(at, size - 1)]
            closing = at == end - 1
            broken[live[closing & (kind != 0)]] = True
            going = ~closing & (at < end - 1) & (kind != 0)
            broken[live[~closing & ~going]] = True
            live, at, kind, end = live[going], at[going], kind[going], end[going]
            if documents:
                key_end = buffer.next_zero(at + 1)
            else:  # an array's keys are its indexes: check the end where the index's digits end
                key_end = at + 1 + len(str(position))
                misplaced = buffer.data[np.minimum(key_end, size - 1)] != 0
                key_end[misplaced] = buffer.next_zero(at[misplaced] + 1)
            value = key_end + 1
            value_size = _FIXED_SIZES_BY_KIND[kind]
            prefixed = np.isin(kind, list(_LENGTH_PREFIXED))
            readable = prefixed & (value + 4 <= end)
            value_size[readable] = buffer.int32(value[readable]) + _add_to_length(kind[readable])
            value_size[readable & (value_size < _add_to_length(kind))] = -1  # a negative length
            regex = kind == REGEX
            if regex.any():
                pattern_end = buffer.next_zero(value[regex])
                value_size[regex] = buffer.next_zero(pattern_end + 1) + 1 - value[regex]
            damaged = (value_size < 0) | (value + value_size > end - 1) | (key_end >= end)
            broken[live[damaged]] = True
            keep = ~damaged
            live, at, kind = live[keep], at[keep], kind[keep]
            key_end, value, value_size = key_end[keep], value[keep], value_size[keep]
            parts.append((live, kind, at + 1, key_end, value, value_size))
            cursor[live] = value + value_size
            position += 1
        bad[containers.root[broken]] = True
        if not parts:
            empty = np.zeros(0, np.int64)
            values = Values(np.zeros(0, np.uint8), empty, empty, empty)
            return Level(empty, empty, np.zeros(0, bool), documents, empty, [], values)
        container, kind, key_start, key_end, value, value_size = (
            np.concatenate(p) for p in zip(*parts, strict=True)
        )
        if not documents:  # an array's elements in their order (a document's fields go by name)
            order = np.argsort(container, kind="stable")
            container, kind, key_start = container[order], kind[order], key_start[order]
            value, value_size = value[order], value_size[order]
        if documents:
            long = key_end - key_start > _NAME_BYTES_MAX
            bad[containers.root[container[long]]] = True  # its name is cut short below: not fast
            keys, names = self._keys(key_start, np.minimum(key_end, key_start + _NAME_BYTES_MAX))
        else:
            keys, names = np.zeros(len(container), np.int64), []
        values = Values(kind, value, value_size, containers.root[container])
        first = key_start - 1 == starts[container] + 4
        return Level(container, key_start - 1, first, documents, keys, names, values)

    def _keys(self, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, list[bytes]]:
        """Each element's field name as an index into the distinct names."""
        lengths = end - start
        width = max(int(lengths.max(initial=0)), 1)
        words = -(-width // 8)
        packed = self.buffer.words(
            start, words
        )  # one row of words per name, zero-padded (names hold no zero)
        for word in range(words):
            packed[:, word] &= _LOW_BYTES_MASKS[np.clip(lengths - 8 * word, 0, 8)]
        if words == 1:  # the names hashed (Arrow's dictionary), not sorted, then their few in order
            encoded = pa.array(packed.reshape(-1)).dictionary_encode()
            distinct = encoded.dictionary.to_numpy()
            order = np.argsort(distinct)
            rank = np.empty(len(order), np.int64)
            rank[order] = np.arange(len(order))
            keys, rows = rank[encoded.indices.to_numpy()], distinct[order].reshape(-1, 1)
        else:  # a hash of the words, checked: a collision (never seen) falls back to comparing rows
            mixed = packed[:, 0].copy()
            for word in range(1, words):
                mixed = mixed * np.uint64(0x9E3779B97F4A7C15) ^ packed[:, word]
            _, first, keys = np.unique(mixed, return_index=True, return_inverse=True)
            rows = packed[first]
            if not (rows[keys.reshape(-1)] == packed).all():
                rows, keys = np.unique(packed, axis=0, return_inverse=True)
        names = [row.astype("<u8").tobytes().rstrip(b"\0") for row in rows]
        return keys.reshape(-1), names

    def _fields(self, level: Level, count: int, bad: np.ndarray) -> dict[str, Values]:
        """Each field's values across ``count`` documents (kind MISSING where one lacks it)."""
        fields = {}
        for key, raw_name in enumerate(level.names):
            selected = np.flatnonzero(level.key == key)
            holders = level.container[selected]
            duplicated = np.bincount(holders, minlength=count) > 1
            if duplicated.any():  # bson.decode keeps the last value where the first stood
                bad[level.values.root[selected[duplicated[holders]]]] = True
            try:
                name = raw_name.decode()
            except UnicodeDecodeError:
                bad[level.values.root[selected]] = True
                continue
            values = Values(
                np.zeros(count, np.uint8),
                np.zeros(count, np.int64),
                np.zeros(count, np.int64),
                np.zeros(count, np.int64),
            )
            for mine, theirs in zip(values, level.values, strict=True):
                mine[holders] = theirs[selected]
            fields[name] = values
        return fields

    # -- census

    def _census(
        self, values: Values, bad: np.ndarray, path: tuple[str, ...], stored: column_types.ColumnType | None
    ) -> column_types.ColumnType:
        """The merged type of ``values`` (``column_survey.column_type`` of them decoded), to go into a column
        of type ``stored`` (None: none yet). ``bad`` gets the roots of the values the fast path does
        not hold exactly: of a kind it does not take, that do not fit ``stored`` (their field goes to
        its fallback sibling), that a ``fallback`` column holds as text, or, with no column yet, of
        every value of the path if their types disagree (the field becomes a fallback column)."""
        present = (values.kind != MISSING) & (values.kind != NULL)
        if stored == column_types.FALLBACK:
            bad[values.root[present]] = True
            return column_types.NULL
        stored_kind = stored[0] if isinstance(stored, tuple) else stored
        merged: list[column_types.ColumnType] = []
        for kind in kinds_in(values.kind[present]):
            where = np.flatnonzero(present & (values.kind == kind))
            kind_of_column = (
                column_types.STRUCT if kind == DOCUMENT else column_types.ARRAY if kind == ARRAY else None
            )
            if kind in _FAST_KINDS:
                kind_of_column = _FAST_KINDS[kind]
            if kind_of_column is None or stored is not None and kind_of_column != stored_kind:
                bad[values.root[where]] = True
            elif kind == DOCUMENT:
                fields = dict(stored[1]) if stored is not None else None
                merged.append(self._struct_census(_take(values, where), bad, path, fields))
            elif kind == ARRAY:
                level = self.levels[path] = self._level(_take(values, where), bad, documents=False)
                element = stored[1] if stored is not None else None
                merged.append((column_types.ARRAY, self._census(level.values, bad, (*path, "[]"), element)))
            else:
                merged.append(kind_of_column)
                self._check_scalars(kind, values, where, bad)
        column = column_types.NULL
        for kind_type in merged:
            column = column_types.merge_types(column, kind_type)
        if column == column_types.FALLBACK:
            bad[values.root[present]] = True
        return column

    def _struct_census(
        self,
        documents: Values,
        bad: np.ndarray,
        path: tuple[str, ...],
        stored: dict[str, column_types.ColumnType] | None,
    ) -> column_types.ColumnType:
        level = self.levels[path] = self._level(documents, bad, documents=True)
        empty = np.ones(len(documents), bool)
        empty[level.container] = False
        bad[documents.root[empty]] = True  # {} is a fallback value: Parquet has no empty groups
        fields = self._fields(level, len(documents), bad)
        return column_types.struct_type(
            (name, self._census(field, bad, (*path, name), stored.get(name) if stored is not None else None))
            for name, field in fields.items()
        )

    def _check_scalars(self, kind: int, values: Values, where: np.ndarray, bad: np.ndarray) -> None:
        """Mark the roots of scalars the lossless path reads differently."""
        if kind == DATE:
            millis = self.int64(values.at[where])
            outside = (millis < column_types.MIN_TIMESTAMP_MS) | (millis > column_types.MAX_TIMESTAMP_MS)
            bad[values.root[where[outside]]] = True
        elif kind == BINARY:
            old = self.buffer.data[values.at[where] + 4] == 2  # subtype 2 nests a second length
            bad[values.root[where[old]]] = True
        elif kind == STRING:
            at, size = values.at[where], values.size[where]
            unterminated = (size < 5) | (self.buffer.data[at + size - 1] != 0)
            bad[values.root[where[unterminated]]] = True
            texts = self.ranges(at + 4, np.maximum(size - 5, 0), pa.binary())
            try:
                texts.cast(pa.string())  # validates UTF-8
            except pa.ArrowInvalid:  # rare: find the invalid ones, one by one
                valid = np.array([_valid_utf8(text) for text in texts.to_pylist()], bool)
                bad[values.root[where[~valid]]] = True

    # -- columns

    def array(self, name: str, column: column_types.ColumnType, arrow: pa.DataType | None = None) -> pa.Array:
        """Field ``name`` of the fast documents (in order) as ``arrow_columns.to_arrow`` gives it for a
        column of type ``column`` (which the census's type fits)."""
        values = self.top.get(name)
        if values is None:
            array = pa.nulls(len(self.documents), arrow_columns.arrow_type(column))
        else:
            array = self._build(values, column, (name,))
        return array if arrow is None or arrow == array.type else array.view(arrow)

    def _build(self, values: Values, column: column_types.ColumnType, path: tuple[str, ...]) -> pa.Array:
        present = (values.kind != MISSING) & (values.kind != NULL)
        where = np.flatnonzero(present)
        if not where.size:  # (a fallback column too: the fast documents hold no value of it)
            return pa.nulls(len(values), arrow_columns.arrow_type(column))
        if isinstance(column, tuple):
            inner = _take(values, where)
            if column[0] == column_types.STRUCT:
                dense = self._struct(inner, column, path)
            else:
                dense = self._list(inner, column, path)
        else:
            dense = self._scalars(int(values.kind[where[0]]), values, where, column)
        if where.size == len(values):
            return dense
        # each slot's position in ``dense``, null where the slot holds no value
        slots = np.cumsum(present) - 1
        return dense.take(pa.array(slots, pa.int64(), mask=~present))

    def _struct(self, documents: Values, column: column_types.ColumnType, path: tuple[str, ...]) -> pa.Array:
        scratch = np.zeros(len(self.fast), bool)
        fields = self._fields(self.levels[path], len(documents), scratch)
        children = []
        for name, field_type in column[1]:
            field = fields.get(name)
            if field is None:
                children.append(pa.nulls(len(documents), arrow_columns.arrow_type(field_type)))
            else:
                children.append(self._build(field, field_type, (*path, name)))
        arrow = arrow_columns.arrow_type(column)
        return (
            pa.StructArray.from_arrays(children, fields=list(arrow), mask=None)
            if children
            else pa.nulls(len(documents), arrow)
        )

    def _list(self, arrays: Values, column: column_types.ColumnType, path: tuple[str, ...]) -> pa.Array:
        level = self.levels[path]
        offsets = np.zeros(len(arrays) + 1, np.int32)
        np.cumsum(np.bincount(level.container, minlength=len(arrays)), out=offsets[1:])
        elements = self._build(level.values, column[1], (*path, "[]"))
        return pa.ListArray.from_arrays(
            pa.array(offsets, pa.int32()), elements, type=arrow_columns.arrow_type(column)
        )

    def _scalars(
        self, kind: int, values: Values, where: np.ndarray, column: column_types.ColumnType
    ) -> pa.Array:
        at = values.at[where]
        if column == column_types.LONG:
            short = values.kind[where] == INT32  # 4 bytes: an int64's 8 may run past the buffer
            out = np.empty(len(at), np.int64)
            out[short] = self.int32(at[short])
            out[~short] = self.int64(at[~short])
            return pa.array(out, pa.int64())
        if column == column_types.DOUBLE:
            return pa.array(self.gather(at, 8).view("<f8").reshape(-1), pa.float64())
        if column == column_types.BOOL:
            return pa.array(self.buffer.data[at] != 0, pa.bool_())
        if column == column_types.DATE:
            return pa.array(self.int64(at) * 1000, pa.timestamp("us", tz="UTC"))
        if column == column_types.OBJECT_ID:
            hex_digits = HEX_DIGITS[self.gather(at, 12)].reshape(-1)
            offsets = np.arange(len(at) + 1, dtype=np.int32) * 24
            return pa.StringArray.from_buffers(len(at), pa.py_buffer(offsets), pa.py_buffer(hex_digits))
        if column == column_types.STRING:
            return self._strings(values, where)
        if column == column_types.BINARY:
            lengths = self.buffer.int32(at)
            return self.ranges(at + 5, lengths, pa.binary())
        raise ValueError(f"no fast column of type {column!r} for BSON kind {kind}")

    def _strings(self, values: Values, where: np.ndarray) -> pa.Array:
        at = values.at[where]
        return self.ranges(at + 4, values.size[where] - 5, pa.string())

    def ranges(self, starts: np.ndarray, lengths: np.ndarray, arrow: pa.DataType) -> pa.Array:
        """The byte ranges as one string or binary array (not validated)."""
        large = pa.large_string() if arrow == pa.string() else pa.large_binary()
        count = len(starts)
        ends = starts + lengths
        if count and (starts[1:] >= ends[:-1]).all() and (lengths >= 0).all():
            # in order and apart (a field's values, say): the buffer as it is holds them, each one
            # followed by the bytes up to the next, and Arrow copies every other value, range by range
            bounds = np.empty(2 * count, np.int64)
            bounds[0::2], bounds[1::2] = starts, ends
            alternate = pa.Array.from_buffers(
                large, 2 * count - 1, [None, pa.py_buffer(bounds), pa.py_buffer(self.buffer.data)]
            )
            return alternate.take(pa.array(np.arange(0, 2 * count, 2))).cast(arrow)
        offsets = np.zeros(count + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        positions = np.repeat(starts - offsets[:-1], lengths) + np.arange(int(offsets[-1]))
        data = self.buffer.data[positions]
        array = pa.Array.from_buffers(large, count, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
        return array.cast(arrow)

    def gather(self, at: np.ndarray, width: int) -> np.ndarray:
        return self.buffer.windows(at, width)

    def int32(self, at: np.ndarray) -> np.ndarray:
        return self.buffer.int32(at)

    def int64(self, at: np.ndarray) -> np.ndarray:
        return self.buffer.int64(at)


def kinds_in(kinds: np.ndarray) -> list[int]:
    """The distinct BSON types of ``kinds``, in order (a count: cheaper than sorting them)."""
    return np.flatnonzero(np.bincount(kinds, minlength=256)).tolist()


def _add_to_length(kinds: np.ndarray) -> np.ndarray:
    table = np.zeros(256, np.int64)
    for kind, extra in _LENGTH_PREFIXED.items():
        table[kind] = extra
    return table[kinds]


def _take(values: Values, where: np.ndarray) -> Values:
    return Values(*(column[where] for column in values))


def _valid_utf8(text: bytes) -> bool:
    try:
        text.decode()
    except UnicodeDecodeError:
        return False
    return True
