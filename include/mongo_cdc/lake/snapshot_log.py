"""The snapshot log (``raw/<topic.prefix>/_snapshots``): each snapshot's plan and its copied chunks.

A snapshot records its position, settings and chunks (``SnapshotPlan``) before it reads a
document, and one ``copied`` row per chunk whose rows are committed, so a snapshot cut short
resumes with the chunks it has not copied, at the same position.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import bson
import pyarrow as pa
from bson import json_util

from mongo_cdc import extjson

SNAPSHOT_LOG_SCHEMA = pa.schema(
    [
        pa.field("rs", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),  # the snapshot's batch number
        # snapshot (its position and settings) and chunk (one row per chunk): the plan, written in
        # one commit when the snapshot starts; copied: one row per chunk whose rows are committed
        pa.field("kind", pa.string(), nullable=False),
        pa.field("namespace", pa.string(), nullable=False),  # "" in the snapshot row
        pa.field("chunk", pa.int32(), nullable=False),  # 0-based, in index order within the namespace
        pa.field("chunks", pa.int32()),  # how many chunks the namespace has
        # the index the bounds are on, JSON [[field, direction], ...]; null: the whole collection
        pa.field("index_key", pa.string()),
        # BSON documents {field: value, ...}: the inclusive lower and exclusive upper bound (null: open)
        pa.field("low", pa.binary()),
        pa.field("high", pa.binary()),
        # chunk rows: documents when planned (for progress); copied rows: documents landed (null: unknown)
        pa.field("documents", pa.int64()),
        # the snapshot row: the snapshot's position and settings (JSON, see SnapshotPlan)
        pa.field("snapshot", pa.string()),
        pa.field("recorded_at", pa.timestamp("us", tz="UTC")),
    ]
)


SNAPSHOT = "snapshot"


CHUNK = "chunk"


COPIED = "copied"


@dataclass(frozen=True)
class Chunk:
    """One key range of a collection, copied and committed on its own.

    ``key`` is the index the bounds are on (``_id``, or a sharded collection's shard key) as
    (field, direction) pairs, None for a collection copied whole in natural order. ``low`` and
    ``high`` are BSON documents of index-key values (``cursor.min``/``max``: inclusive, exclusive),
    None where the range is open.
    """

    namespace: str
    index: int
    count: int
    key: tuple[tuple[str, Any], ...] | None = None
    low: bytes | None = None
    high: bytes | None = None
    expected: int = 0  # documents when planned: progress and ETA only

    @property
    def label(self) -> str:
        return f"{self.namespace} {self.index + 1}/{self.count}"

    def bounds(self) -> tuple[dict | None, dict | None]:
        """The bounds decoded, for ``cursor.min``/``max``."""
        return _decoded(self.low), _decoded(self.high)

    def describe(self) -> str:
        """The range as a log line shows it."""
        if self.key is None:
            return "the whole collection"
        low, high = self.bounds()
        return f"[{_bound_text(low, 'start')}, {_bound_text(high, 'end')})"


def _decoded(bound: bytes | None) -> dict | None:
    return bson.decode(bound, extjson.DECODE_OPTIONS) if bound is not None else None


def _bound_text(bound: dict | None, open_end: str) -> str:
    if bound is None:
        return open_end
    return ", ".join(extjson.encode_str(value) for value in bound.values())


def _index_key(text: str | None) -> tuple[tuple[str, Any], ...] | None:
    return tuple((field, direction) for field, direction in json.loads(text)) if text else None


@dataclass(frozen=True)
class SnapshotPlan:
    """A snapshot batch's position, settings and chunks, recorded before any chunk is read."""

    rs: str
    seq: int
    resume_token: dict  # the position taken before the copy
    cluster_time: int
    requested: tuple[str, ...]  # the collections asked for (``run_snapshot``'s ``only``); (): every one
    keeps_position: bool  # streaming goes on from the stored position, not from this one
    back_from_retirement: bool
    started_at: str
    # every collection copied (its manifest): one a shard owns no range of has no chunk
    collections: tuple[str, ...]
    chunks: tuple[Chunk, ...]
    # a filtered re-snapshot's filters (Extended JSON text, ``capture.snapshot_filters``) by
    # namespace: a collection named here is read through its filter only
    filters: Mapping[str, str] = field(default_factory=dict)

    def to_rows(self) -> list[dict]:
        now = dt.datetime.now(dt.timezone.utc)
        settings = {
            "resume_token": json.loads(extjson.encode(self.resume_token)),
            "cluster_time": self.cluster_time,
            "requested": list(self.requested),
            "keeps_position": self.keeps_position,
            "back_from_retirement": self.back_from_retirement,
            "started_at": self.started_at,
            "collections": list(self.collections),
            "filters": dict(self.filters),
        }
        header = {"rs": self.rs, "seq": self.seq, "kind": SNAPSHOT, "namespace": "", "chunk": -1,
                  "snapshot": json.dumps(settings, sort_keys=True), "recorded_at": now}  # fmt: skip
        return [header] + [
            {
                "rs": self.rs,
                "seq": self.seq,
                "kind": CHUNK,
                "namespace": chunk.namespace,
                "chunk": chunk.index,
                "chunks": chunk.count,
                "index_key": json.dumps(chunk.key) if chunk.key is not None else None,
                "low": chunk.low,
                "high": chunk.high,
                "documents": chunk.expected,
                "recorded_at": now,
            }
            for chunk in self.chunks
        ]

    @classmethod
    def from_rows(cls, header: dict, rows: list[dict]) -> SnapshotPlan:
        settings = json.loads(header["snapshot"])
        chunks = sorted(
            (
                Chunk(
                    namespace=row["namespace"],
                    index=row["chunk"],
                    count=row["chunks"],
                    key=_index_key(row["index_key"]),
                    low=row["low"],
                    high=row["high"],
                    expected=row["documents"] or 0,
                )
                for row in rows
            ),
            key=lambda chunk: (chunk.namespace, chunk.index),
        )
        return cls(
            rs=header["rs"],
            seq=header["seq"],
            resume_token=json_util.loads(json.dumps(settings["resume_token"])),
            cluster_time=settings["cluster_time"],
            requested=tuple(settings["requested"]),
            keeps_position=settings["keeps_position"],
            back_from_retirement=settings["back_from_retirement"],
            started_at=settings["started_at"],
            collections=tuple(settings["collections"]),
            chunks=tuple(chunks),
            filters=settings.get("filters", {}),  # none in plans recorded before filters existed
        )
