"""Raw rows as change events, and which of them a derived table still has to apply.

A derived table records, per replica set, the last batch it applied (a Delta app transaction of
its own: ``applied_app_id``). Its new events are the raw rows of committed batches past that
(``lake.batch_log.BatchWindow``); backfilled history rows (``lake.HISTORY_SEQ``) belong to no batch.

Rows are read column-wise where that is enough (``event_keys``: the normalised key of every row
at once; ``RowDocuments``: their documents as a column of BSON) and as ``ChangeEvent`` objects
(``event_from_row``) where an event's values are needed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import bson
import orjson
import pyarrow as pa
import pyarrow.compute as pc
from bson import json_util

from mongo_cdc.extjson import READ_OPTIONS
from mongo_cdc.transform.keys import document_key

if TYPE_CHECKING:
    from deltalake import DeltaTable

RAW_COLUMNS = [
    "key",
    "op",
    "ts_ms",
    "after",
    "updateDescription",
    "source",
    "cluster_time",
    "event_order",
    "batch_seq",
]
# _id values as the raw key holds them (Extended JSON): dates exact to the millisecond
_KEY_OPTIONS = json_util.JSONOptions(datetime_conversion=bson.DatetimeConversion.DATETIME_MS)


class ChangeEvent(NamedTuple):
    document_id: Any  # the _id value, decoded (``extjson.READ_OPTIONS`` types)
    document_id_json: str  # the Extended JSON of _id, as in the key: {"id": "<EJSON of _id>"}
    op: str | None  # r, c, u, d, drop, rename; None for a tombstone
    ts_ms: int | None  # when mongo-cdc processed the event
    after_bson: bytes | None  # the document as the raw zone holds it (BSON)
    # updatedFields (BSON, its field names dotted paths), removedFields, truncatedArrays
    update_description: dict | None
    source: dict[str, Any] | None  # the raw source struct: ts_ms, rs, collection... (see lake.RAW_SCHEMA)
    cluster_time: int
    event_order: str  # hex resume token; "" (a snapshot read) sorts first
    rs: str  # the replica set whose oplog or snapshot the event came from
    # the pre-image (BSON) under the *_with_pre_image capture modes; None where the raw ``before``
    # column was not read (``RAW_COLUMNS`` leaves it out: only a rewritten delete row needs it)
    before_bson: bytes | None = None

    @property
    def after(self) -> dict | None:
        """The document, decoded (``extjson.READ_OPTIONS``)."""
        return _decoded(self.after_bson)

    @property
    def before(self) -> dict | None:
        """The pre-image, decoded (``extjson.READ_OPTIONS``)."""
        return _decoded(self.before_bson)

    @property
    def position(self) -> tuple[int, str]:
        """Where the event sits in the document's history (compare positions to order events)."""
        return self.cluster_time, self.event_order


def event_from_row(row: dict[str, Any]) -> ChangeEvent:
    id_json = orjson.loads(row["key"])["id"]
    return ChangeEvent(
        document_id=_document_id(id_json),
        document_id_json=id_json,
        op=row["op"],
        ts_ms=row["ts_ms"],
        after_bson=row["after"],
        update_description=row["updateDescription"],
        source=row["source"],
        cluster_time=row["cluster_time"],
        event_order=row["event_order"],
        rs=row["source"]["rs"],
        before_bson=row.get("before"),
    )


# Raw keys (``extjson.document_key``) of the commonest _id types, and their normalised keys
# (``keys.document_key``) and Extended JSON, built from the captured text alone: ObjectIds, integers
# MongoDB stores as int32 (bare digits in the key) and strings with nothing JSON escapes.
_KEY_FORMS = (
    (r'^\{"id":"\{\\"\$oid\\":\\"(?P<v>[0-9a-f]{24})\\"\}"\}$', ('["oid","', '"]'), ('{"$oid":"', '"}')),
    (r'^\{"id":"(?P<v>0|-?[1-9][0-9]*)"\}$', ('["n","', '"]'), ("", "")),
    (r'^\{"id":"\\"(?P<v>[^"\\\x00-\x1f]*)\\""\}$', ('["s","', '"]'), ('"', '"')),
)


def event_keys(raw_keys: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, pa.Array]:
    """``(document_key(_id), Extended JSON of _id)`` of each raw ``key``, as ``event_from_row`` and
    ``keys.document_key`` give them: column-wise for the common _id types, one by one for the rest."""
    raw = raw_keys.combine_chunks() if isinstance(raw_keys, pa.ChunkedArray) else raw_keys
    keys = ids = pa.nulls(len(raw), pa.string())
    for pattern, (key_head, key_tail), (id_head, id_tail) in _KEY_FORMS:
        value = pc.struct_field(pc.extract_regex(raw, pattern), "v")
        if value.null_count == len(value):  # no key of this form
            continue
        form_keys = pc.binary_join_element_wise(key_head, value, key_tail, "")
        form_ids = pc.binary_join_element_wise(id_head, value, id_tail, "")
        if keys.null_count == len(keys):
            keys, ids = form_keys, form_ids
        else:
            keys, ids = pc.coalesce(keys, form_keys), pc.coalesce(ids, form_ids)
        if not keys.null_count:  # the keys are of the forms so far (a collection's _ids often of one)
            break
    if keys.null_count:
        missing = pc.is_null(keys).to_pylist()
        key_list, id_list = keys.to_pylist(), ids.to_pylist()
        for index, (text, is_missing) in enumerate(zip(raw.to_pylist(), missing, strict=True)):
            if is_missing:
                id_json = orjson.loads(text)["id"]
                id_list[index] = id_json
                key_list[index] = document_key(_document_id(id_json))
        keys, ids = pa.array(key_list, pa.string()), pa.array(id_list, pa.string())
    return keys, ids


class WholeDocument:
    """A whole document as the raw zone holds it (BSON), decoded (``READ_OPTIONS``) the first time
    its values are asked for: the fast path (``transform.bson_columns``) reads the bytes only."""

    __slots__ = ("bson", "_decoded")

    def __init__(self, data: bytes) -> None:
        self.bson = data
        self._decoded: dict | None = None

    def decoded(self) -> dict:
        if self._decoded is None:
            self._decoded = bson.decode(self.bson, READ_OPTIONS)
        return self._decoded


class RowDocuments(Sequence):
    """Rows' documents column-wise: each row's whole document as BSON (null: none), made into a
    ``WholeDocument`` only when a row's document is asked for (the lossless path: a few rows), once
    per row of the column it came from, so that a document decoded for the state table is decoded
    once for the changes table too; and rows whose document is a value of its own (``replaced``: a
    document built from an event, not a whole document). Taking rows (``take``) copies no document."""

    def __init__(
        self,
        column: pa.BinaryArray | pa.ChunkedArray,
        rows: pa.Array | None = None,
        values: dict[int, Any] | None = None,
        made: dict[int, WholeDocument] | None = None,
    ) -> None:
        self._column = column  # the BSON of the rows of a slice (a null: no document)
        self._rows = rows  # the row of ``column`` of each item (null: no document); None: the same
        self._values = values or {}  # the items that are a value of their own, by position
        self._made = made if made is not None else {}  # the WholeDocument of each row of ``column``

    @classmethod
    def of(cls, documents: Sequence[dict | WholeDocument | None]) -> RowDocuments:
        """``documents`` (values, whole documents or None) as values of their own."""
        return cls(
            pa.nulls(len(documents), pa.binary()),
            values={index: document for index, document in enumerate(documents) if document is not None},
        )

    def __len__(self) -> int:
        return len(self._column) if self._rows is None else len(self._rows)

    def __getitem__(self, index: int) -> Any:  # type: ignore[override]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        if index in self._values:
            return self._values[index]
        row = index if self._rows is None else self._rows[index].as_py()
        if row is None or not self._column[row].is_valid:
            return None
        document = self._made.get(row)
        if document is None:
            document = self._made[row] = WholeDocument(self._column[row].as_py())
        return document

    def __eq__(self, other: object) -> bool:
        """Equal to a sequence of the same documents (dicts, ``WholeDocument``s or None)."""
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def take(self, indices: pa.Array) -> RowDocuments:
        """The items at ``indices`` (a null index: no document)."""
        indices = indices.cast(pa.int64())
        rows = indices if self._rows is None else self._rows.take(indices)
        values = {}
        if self._values:
            values = {
                position: self._values[index]
                for position, index in enumerate(indices.to_pylist())
                if index in self._values
            }
        return RowDocuments(self._column, rows, values, self._made)

    def replaced(self, values: dict[int, Any]) -> RowDocuments:
        """These documents with the items at ``values``' positions replaced by its values."""
        return RowDocuments(self._column, self._rows, {**self._values, **values}, self._made)

    def missing(self) -> pa.BooleanArray | pa.ChunkedArray:
        """Whether each item has no document."""
        absent = pc.is_null(self._column)
        if self._rows is not None:
            absent = pc.fill_null(absent.take(self._rows), True)
        if self._values:
            positions = pa.array(list(self._values), pa.int64())
            absent = pc.and_(absent, pc.invert(pc.is_in(pa.array(range(len(self)), pa.int64()), positions)))
        return absent

    @property
    def bson(self) -> pa.BinaryArray | pa.ChunkedArray:
        """The BSON of each item's whole document (null: none, or a value of its own)."""
        column = self._column if self._rows is None else self._column.take(self._rows)
        if self._values:
            positions = pa.array(list(self._values), pa.int64())
            own = pc.is_in(pa.array(range(len(self)), pa.int64()), positions)
            column = pc.if_else(own, pa.nulls(len(column), column.type), column)
        return column

    def same_as(self, other: RowDocuments) -> bool:
        """Whether ``other`` holds the same whole documents, item for item, and no value of its own."""
        if self._values or other._values or self._made is not other._made or len(self) != len(other):
            return False
        if self._rows is None and other._rows is None:
            return True
        if self._rows is None or other._rows is None:  # the rows of the column as it is
            every = pa.array(range(len(self)), pa.int64())
            return (self._rows if other._rows is None else other._rows).equals(every)
        return self._rows.equals(other._rows)


def as_dict(document: dict | WholeDocument | None) -> dict | None:
    """``document``'s values: a whole document decoded."""
    return document.decoded() if isinstance(document, WholeDocument) else document


def _document_id(id_json: str | None) -> Any:
    return json_util.loads(id_json, json_options=_KEY_OPTIONS) if id_json is not None else None


def _decoded(data: bytes | None) -> dict | None:
    return bson.decode(data, READ_OPTIONS) if data is not None else None


def applied_app_id(table: str, rs: str) -> str:
    """The app transaction id under which a derived table records the last batch of ``rs`` it applied."""
    return f"mongo-cdc-{table}/{rs}"


def applied_batches(table: DeltaTable | None, name: str, replica_sets: Iterable[str]) -> dict[str, int]:
    """The last batch of each of ``replica_sets`` the derived table ``name`` (``state``, ``changes``)
    has applied, as its app transactions record it (0: none; no table: nothing applied)."""
    if table is None:
        return {}
    return {rs: table.transaction_version(applied_app_id(name, rs)) or 0 for rs in replica_sets}
