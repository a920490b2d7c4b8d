"""The values ``snapshot.mode`` takes (Debezium's), and when each copies a shard's collections: the
table the setting is checked against (``config.source``) and a shard's plan reads
(``capture.shard_lifecycle.plan_shard``, which documents the lifecycle)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SnapshotMode:
    streams: bool  # the change stream is read after any copy (False: the copy is all there is)
    every_run: bool  # every shard is copied again at every run
    when_missing: bool  # a shard without a completed snapshot is copied
    new_collections: bool  # collections the capture filters newly match are copied, the rest streamed
    when_position_lost: bool  # a shard whose stored position has left the oplog is copied again


# no_data and never mean the same: copy nothing, stream from the position of the first run
SNAPSHOT_MODES = {
    "initial": SnapshotMode(
        streams=True, every_run=False, when_missing=True, new_collections=True, when_position_lost=False
    ),
    "when_needed": SnapshotMode(
        streams=True, every_run=False, when_missing=True, new_collections=True, when_position_lost=True
    ),
    "always": SnapshotMode(
        streams=True, every_run=True, when_missing=True, new_collections=False, when_position_lost=False
    ),
    "initial_only": SnapshotMode(
        streams=False, every_run=False, when_missing=True, new_collections=False, when_position_lost=False
    ),
    "no_data": SnapshotMode(
        streams=True, every_run=False, when_missing=False, new_collections=False, when_position_lost=False
    ),
    "never": SnapshotMode(
        streams=True, every_run=False, when_missing=False, new_collections=False, when_position_lost=False
    ),
}
