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

    @property
    def copies(self) -> bool:
        """Whether the mode ever copies collections by itself (a trigger's re-snapshot aside)."""
        return self.every_run or self.when_missing or self.new_collections or self.when_position_lost


# no_data and never mean the same: copy nothing, stream from the position of the first run
SNAPSHOT_MODES = {
    "initial": SnapshotMode(when_missing=True, new_collections=True),
    "when_needed": SnapshotMode(when_missing=True, new_collections=True, when_position_lost=True),
    "always": SnapshotMode(every_run=True, when_missing=True),
    "initial_only": SnapshotMode(streams=False, when_missing=True),
    "no_data": SnapshotMode(),
    "never": SnapshotMode(),
}

# What ``when_needed`` does for a shard whose position left the oplog (``oplog.lost.recovery``): heal
# the lake by a verification (``capture.oplog_recovery``), or copy every collection again.
HEAL_LOST_OPLOG, RESNAPSHOT_LOST_OPLOG = OPLOG_LOST_RECOVERIES = ("heal", "resnapshot")

# The keys that set where a stream without a copy starts (``capture.stream_start``).
START_POSITION_KEYS = ("capture.start.op.time", "capture.start.resume.token")


def check_start_position(snapshot_mode: str, start_key: str | None) -> None:
    """Refuse a start position (``start_key``, one of START_POSITION_KEYS; None: none) with a mode that
    copies or never streams: a copy would be taken at its own position, and the start would mean
    nothing."""
    if start_key is None:
        return
    mode = SNAPSHOT_MODES[snapshot_mode]
    if mode.streams and not mode.copies:
        return
    fitting = " or ".join(name for name, fits in SNAPSHOT_MODES.items() if fits.streams and not fits.copies)
    raise ValueError(
        f"key '{start_key}' starts streaming without copying, which snapshot.mode '{snapshot_mode}' "
        f"does not do; it works with snapshot.mode {fitting}: set one of them, or drop '{start_key}'"
    )
