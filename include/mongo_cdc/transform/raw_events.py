"""Raw rows as change events, and which of them a derived table still has to apply.

A derived table records, per replica set, the last batch it applied (a Delta app transaction of
its own: ``applied_app_id``). Its new events are the raw rows of committed batches past that
(``lake.batch_log.BatchWindow``); backfilled history rows (``lake.HISTORY_SEQ``) belong to no batch.

Rows are read column-wise where that is enough (``event_keys``: the normalised key of every row
at once) and as ``ChangeEvent`` objects (``event_from_row``) where an event's values are needed.
"""

from __future__ import annotations

from collections.abc import Iterable
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
    keys = pa.nulls(len(raw), pa.string())
    ids = pa.nulls(len(raw), pa.string())
    for pattern, (key_head, key_tail), (id_head, id_tail) in _KEY_FORMS:
        value = pc.struct_field(pc.extract_regex(raw, pattern), "v")
        keys = pc.coalesce(keys, pc.binary_join_element_wise(key_head, value, key_tail, ""))
        ids = pc.coalesce(ids, pc.binary_join_element_wise(id_head, value, id_tail, ""))
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
