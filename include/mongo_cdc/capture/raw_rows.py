"""Debezium-style raw rows built from MongoDB change-stream events and snapshot reads.

Each event becomes one row of ``lake.RAW_SCHEMA``; a delete is followed by a tombstone row
(same key, every value column null) when ``tombstones.on.delete`` is on. Documents are kept as
BSON bytes (the server's own where there are no field rules), so every document round-trips
exactly, whatever its field names and types; the transform renders JSON and typed columns from them.
A batch's rows become one Arrow table in ``raw_tables``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import bson

from mongo_cdc import __version__, extjson
from mongo_cdc.capture.change_cursor import bson_bytes
from mongo_cdc.capture.field_filters import CollectionFieldRules
from mongo_cdc.extjson import DECODE_OPTIONS
from mongo_cdc.lake import SOURCE_TYPE, pack_cluster_time

CONNECTOR = "mongodb"
VERSION = f"mongo-cdc-{__version__}"

# change-stream operationType -> Debezium op
DATA_OPERATIONS = {"insert": "c", "update": "u", "replace": "u", "delete": "d"}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class SourceInfo:
    """The parts of Debezium's ``source`` block that are fixed for one replica set of one source."""

    name: str  # topic.prefix
    rs: str

    def values(
        self,
        db: str,
        collection: str,
        cluster_time: int,
        ts_ms: int,
        snapshot: bool,
        lsid: str | None = None,
        txn_number: int | None = None,
        wall_time: int | None = None,
        sequence: str | None = None,
    ) -> tuple[Any, ...]:
        """The ``source`` block's values, in ``SOURCE_TYPE``'s order (``SOURCE_NAMES``). ``sequence``
        marks a row healed after a lost oplog (``oplog_recovery.RECOVERY_SEQUENCE``)."""
        return (
            VERSION,
            CONNECTOR,
            self.name,
            ts_ms,
            snapshot,
            db,
            self.rs,
            collection,
            cluster_time & 0xFFFFFFFF,  # ord
            lsid,
            txn_number,
            # Debezium's common source fields: sequence is for connectors with a multi-part position
            # (never set by its MongoDB connector, so free to mark a recovery's rows); ts_us/ts_ns
            # are ts_ms at finer units
            sequence,
            ts_ms * 1000,
            ts_ms * 1_000_000,
            wall_time,
        )

    def block(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The ``source`` block as a dict (arguments as ``values``)."""
        return dict(zip(SOURCE_NAMES, self.values(*args, **kwargs), strict=True))


def event_position(change: dict) -> tuple[int, int]:
    """(packed cluster time, source ts_ms) of a change event; ts_ms is its wall time if it has one."""
    ts = change["clusterTime"]
    wall = change.get("wallTime")
    return pack_cluster_time(ts.time, ts.inc), int(wall) if wall is not None else ts.time * 1000


class RawRow(NamedTuple):
    """A raw row as a pull gathers it (``RAW_SCHEMA`` less ``batch_seq`` and ``hour``, which a table of
    rows gets in bulk: ``raw_rows_table``)."""

    # the key payload, or the BSON of the event's documentKey, keyed in bulk with the others
    key: str | bytes
    op: str | None
    ts_ms: int
    before: bytes | None
    after: bytes | None
    update_description: dict[str, Any] | None
    source: tuple[Any, ...]  # SourceInfo.values
    cluster_time: int
    event_order: str
    transaction: dict[str, Any] | None = None

    @property
    def source_ts_ms(self) -> int:
        return self.source[_SOURCE_TS_MS]


def raw_rows_of_change(
    change: dict,
    source: SourceInfo,
    tombstones: bool,
    fields: CollectionFieldRules | None = None,
    transaction: dict[str, Any] | None = None,
) -> list[RawRow]:
    """Raw rows for one insert/update/replace/delete change-stream event, read raw
    (``open_change_stream``): its documents land as the server's bytes (``fields``: its collection's
    ``field.exclude.list`` / ``field.renames``, which rewrite them; ``transaction``: the event's
    transaction block)."""
    op = DATA_OPERATIONS[change["operationType"]]
    cluster_time, source_ts_ms = event_position(change)
    wall = change.get("wallTime")
    lsid = change.get("lsid")
    txn_number = change.get("txnNumber")
    after = change.get("fullDocument")
    if after is not None:
        after = bson_bytes(after)
    # only with a pre-image capture.mode, and never for inserts
    before = change.get("fullDocumentBeforeChange")
    if before is not None:
        before = bson_bytes(before)
    description = change.get("updateDescription")
    update_description = _update_description(description) if description is not None else None
    if fields is not None:
        after, before, update_description = apply_field_rules(fields, after, before, update_description)
    ns = change["ns"]
    row = RawRow(
        bson_bytes(change["documentKey"]),  # keyed in bulk with the batch's others (raw_rows_table)
        op,
        now_ms(),
        before,
        after,
        update_description,
        source.values(
            ns["db"],
            ns["coll"],
            cluster_time,
            source_ts_ms,
            False,
            extjson.encode_str(bson.decode(bson_bytes(lsid), DECODE_OPTIONS)) if lsid is not None else None,
            int(txn_number) if txn_number is not None else None,
            int(wall) if wall is not None else None,
        ),
        cluster_time,
        change["_id"]["_data"],
        transaction,
    )
    if op == "d" and tombstones:
        return [row, tombstone_of(row)]
    return [row]


def apply_field_rules(
    fields: CollectionFieldRules,
    after: bytes | None,
    before: bytes | None,
    update_description: dict[str, Any] | None,
) -> tuple[bytes | None, bytes | None, dict[str, Any] | None]:
    """An event's documents and update description (as raw rows hold them) after its collection's
    field rules: the one place the change-stream path hands documents to ``field_filters``."""

    def rewritten(document: bytes | None) -> bytes | None:
        return fields.document(document) if document is not None else None

    if update_description is not None:
        update_description = fields.update_description(update_description)
    return rewritten(after), rewritten(before), update_description


def tombstone_of(row: RawRow) -> RawRow:
    """The tombstone after a delete's row: same key, every value column null."""
    return RawRow(row.key, None, row.ts_ms, None, None, None, row.source, row.cluster_time, row.event_order)


def _update_description(description: Any) -> dict[str, Any]:
    """A raw row's ``updateDescription``: ``updatedFields`` as the server's bytes."""
    updated = description.get("updatedFields")
    return {
        "updatedFields": bson_bytes(updated) if updated is not None else _EMPTY_DOCUMENT,
        "removedFields": list(description.get("removedFields") or []),
        "truncatedArrays": [
            {"field": t["field"], "newSize": int(t["newSize"])}
            for t in description.get("truncatedArrays") or []
        ],
    }


def raw_row(row: dict[str, Any]) -> RawRow:
    """A raw row given as a dict of ``RAW_SCHEMA``'s columns (``source`` a dict too) as a ``RawRow``."""
    source = row.get("source")
    return RawRow(
        row["key"],
        row.get("op"),
        row.get("ts_ms"),  # type: ignore[arg-type]
        row.get("before"),
        row.get("after"),
        row.get("updateDescription"),
        tuple(source.get(name) for name in SOURCE_NAMES) if source is not None else None,  # type: ignore[arg-type]
        row["cluster_time"],
        row["event_order"],
        row.get("transaction"),
    )


SOURCE_NAMES = tuple(field.name for field in SOURCE_TYPE)
_SOURCE_TS_MS = SOURCE_NAMES.index("ts_ms")
_EMPTY_DOCUMENT = bson.encode({})
