"""Raw rows as change events, and which of them a derived table still has to apply.

A derived table records, per replica set, the last batch it applied (a Delta app transaction of
its own: ``applied_app_id``). Its new events are the raw rows of committed batches past that
(``BatchWindow``); backfilled history rows (``lake.HISTORY_SEQ``) belong to no batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import bson
import orjson
import pyarrow.compute as pc
from bson import json_util

from mongo_cdc.extjson import DECODE_OPTIONS
from mongo_cdc.lake import HISTORY_SEQ

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
    document_id: Any  # the _id value, decoded (``extjson.DECODE_OPTIONS`` types)
    document_id_json: str  # the Extended JSON of _id, as in the key: {"id": "<EJSON of _id>"}
    op: str | None  # r, c, u, d, drop, rename; None for a tombstone
    ts_ms: int | None  # when mongo-cdc processed the event
    after_bson: bytes | None  # the document as the raw zone holds it (BSON)
    update_description: dict | None  # updatedFields (a decoded document), removedFields, truncatedArrays
    source: dict[str, Any] | None  # the raw source struct: ts_ms, rs, collection... (see lake.RAW_SCHEMA)
    cluster_time: int
    event_order: str  # hex resume token; "" (a snapshot read) sorts first
    rs: str  # the replica set whose oplog or snapshot the event came from

    @property
    def after(self) -> dict | None:
        """The document, decoded (``extjson.DECODE_OPTIONS``)."""
        return _decoded(self.after_bson)

    @property
    def position(self) -> tuple[int, str]:
        """Where the event sits in the document's history (compare positions to order events)."""
        return self.cluster_time, self.event_order


def event_from_row(row: dict[str, Any]) -> ChangeEvent:
    id_json = orjson.loads(row["key"])["id"]
    description = row["updateDescription"]
    if description is not None:
        description = {**description, "updatedFields": _decoded(description["updatedFields"])}
    return ChangeEvent(
        document_id=json_util.loads(id_json, json_options=_KEY_OPTIONS) if id_json is not None else None,
        document_id_json=id_json,
        op=row["op"],
        ts_ms=row["ts_ms"],
        after_bson=row["after"],
        update_description=description,
        source=row["source"],
        cluster_time=row["cluster_time"],
        event_order=row["event_order"],
        rs=row["source"]["rs"],
    )


def _decoded(data: bytes | None) -> dict | None:
    return bson.decode(data, DECODE_OPTIONS) if data is not None else None


@dataclass(frozen=True)
class BatchWindow:
    """Which raw rows a table applies in this run: per replica set, batches in (applied, committed]."""

    applied: Mapping[str, int]
    committed: Mapping[str, int]

    @property
    def is_empty(self) -> bool:
        return all(seq <= self.applied.get(rs, 0) for rs, seq in self.committed.items())

    def filter(self) -> pc.Expression:
        keep = pc.scalar(False)
        for rs, seq in self.committed.items():
            low = self.applied.get(rs, 0)
            if seq > low:
                in_window = (pc.field("batch_seq") > low) & (pc.field("batch_seq") <= seq)
                keep = keep | ((pc.field("source", "rs") == rs) & in_window)
        return keep

    def may_hold(self, min_seq: int | None, max_seq: int | None) -> bool:
        """Whether a file whose ``batch_seq`` statistics are [min_seq, max_seq] may hold rows of the window."""
        if max_seq is None or min_seq is None:
            return True
        return any(
            max_seq > self.applied.get(rs, 0) and min_seq <= seq
            for rs, seq in self.committed.items()
            if seq > self.applied.get(rs, 0)
        )


def committed_filter(committed: Mapping[str, int]) -> pc.Expression:
    """Every row of a committed batch, and every history row (a backfill's rebuilt hours read these)."""
    keep = pc.field("batch_seq") == HISTORY_SEQ
    for rs, seq in committed.items():
        keep = keep | ((pc.field("source", "rs") == rs) & (pc.field("batch_seq") <= seq))
    return keep


def applied_app_id(table: str, rs: str) -> str:
    """The app transaction id under which a derived table records the last batch of ``rs`` it applied."""
    return f"mongo-cdc-{table}/{rs}"
