"""The values ``snapshot.mode`` takes (Debezium's), and when each copies a shard's collections: the
table the setting is checked against (``config.source``) and a shard's plan reads
(``capture.shard_lifecycle.plan_shard``, which documents the lifecycle)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SnapshotMode:
    """What a mode does; the defaults are ``no_data``'s: stream, and copy nothing."""

    streams: bool = True  # the change stream is read after any copy (False: the copy is all there is)
    every_run: bool = False  # every shard is copied again at every run
    when_missing: bool = False  # a shard without a completed snapshot is copied
    new_collections: bool = False  # collections the capture filters newly match are copied, the rest streamed
    when_position_lost: bool = False  # a shard whose stored position has left the oplog is copied again


# no_data and never mean the same: copy nothing, stream from the position of the first run
SNAPSHOT_MODES = {
    "initial": SnapshotMode(when_missing=True, new_collections=True),
    "when_needed": SnapshotMode(when_missing=True, new_collections=True, when_position_lost=True),
    "always": SnapshotMode(every_run=True, when_missing=True),
    "initial_only": SnapshotMode(streams=False, when_missing=True),
    "no_data": SnapshotMode(),
    "never": SnapshotMode(),
}
