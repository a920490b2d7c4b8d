"""What one shard's sync does in a run: the single owner of the shard lifecycle decisions.

A shard (a plain replica set is one shard) is, in turn:

* **new** (no offset): snapshotted under ``initial``/``when_needed``/``initial_only``/``always``,
  or streamed without a copy under ``no_data``/``never``: from "now", or from
  ``capture.start.op.time``/``capture.start.resume.token`` (``stream_start`` says when those apply);
* **snapshotting**: its offset's snapshot is still running (an earlier run's copy failed midway):
  the next run resumes it (``snapshot.start_snapshot`` keeps the chunks already copied);
* **streaming**: its offset has a completed snapshot and a resume position; it snapshots again only
  under ``always``, when the trigger asks for a re-snapshot of it, or under ``when_needed`` when
  its position has left the oplog (or, with ``oplog.lost.recovery`` ``heal``, the default, it is
  healed instead: ``oplog_recovery``, also while an earlier run's recovery is unfinished). Under
  ``initial`` and ``when_needed``, collections the capture
  filters newly match are copied too (their events since the stored position are streamed);
* **retiring**: it left the cluster but its offset is not retired yet: its stream is drained to
  the end, then its offset is marked ``retired_at``; it is never snapshotted;
* **retired**: gone and drained; ``discover`` no longer lists it;
* **back from retirement**: listed by the cluster again with a retired offset: it starts afresh,
  like a new shard (its batch numbers keep increasing, see ``snapshot.run_snapshot``).

``plan_shard`` turns the stored offset, the settings and the trigger into a ``ShardPlan``; the
Airflow tasks only carry it out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from mongo_cdc.capture.offsets import Offset
from mongo_cdc.config.snapshot_mode_table import HEAL_LOST_OPLOG, SNAPSHOT_MODES


@dataclass(frozen=True)
class ResnapshotRequest:
    """The trigger's re-snapshot: these collections (empty: all) on these shards (empty: all)."""

    collections: tuple[str, ...] = ()
    shards: tuple[str, ...] = ()

    def covers(self, shard_id: str) -> bool:
        return not self.shards or shard_id in self.shards


@dataclass(frozen=True)
class ShardPlan:
    """One shard's sync in one run.

    ``snapshot``: the ``<db>.<collection>`` names to copy before streaming (``()``: every captured
    collection), or None for no copy. ``start_without_copy``: no copy and no stored position, so
    streaming starts at a position of its own (``stream_start``: now, or the configured one).
    ``stream``: read the change stream after the copy. ``retire``: the shard left the cluster; after
    draining, its offset is retired. ``fresh``: a stored offset was retired, and does not count.
    ``reason``: why, for the task log. ``recover``: the shard's position left the oplog (in this run
    or an earlier one whose recovery is unfinished): its stream starts again at a new position if
    it must and this run's verification heals every collection (``oplog_recovery``).
    """

    snapshot: tuple[str, ...] | None
    start_without_copy: bool
    stream: bool
    retire: bool
    fresh: bool
    reason: str
    recover: bool = False

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["snapshot"] = None if self.snapshot is None else list(self.snapshot)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardPlan:
        snapshot = data["snapshot"]
        return cls(**{**data, "snapshot": None if snapshot is None else tuple(snapshot)})


def plan_shard(
    *,
    shard_id: str,
    retiring: bool,
    offset: Offset | None,
    snapshot_mode: str,
    resnapshot: ResnapshotRequest | None,
    position_lost: Callable[[Offset], bool],
    oplog_lost_recovery: str,
    recovery_pending: Callable[[], bool] = lambda: False,
    newly_captured: Callable[[Offset], tuple[str, ...]] = lambda offset: (),
) -> ShardPlan:
    """Decide one shard's sync. ``position_lost`` asks the server whether an offset's resume
    position has left the oplog; it is called only when the answer matters (``when_needed``), and
    ``oplog_lost_recovery`` (``heal``, ``resnapshot``) says what follows. ``recovery_pending`` asks the
    lake whether an earlier run's recovery is unfinished (``oplog_recovery.recovery_pending``).
    ``newly_captured`` lists the collections a streaming offset's capture filter did not match
    (``snapshot.newly_captured``); it is called only for such an offset."""
    mode = SNAPSHOT_MODES[snapshot_mode]
    stream = mode.streams
    if retiring:
        # nothing to copy from a shard that left: its documents moved to the others
        why = "it left the cluster: draining its stream, then retiring its offset"
        return ShardPlan(None, False, stream, True, False, why if stream else "it left the cluster")
    fresh = offset is not None and bool(offset.retired_at)
    if fresh:
        offset = None

    def copy(collections: tuple[str, ...], reason: str) -> ShardPlan:
        return ShardPlan(collections, False, stream, False, fresh, reason)

    if mode.every_run:
        return copy((), f"snapshot.mode is {snapshot_mode}")
    if (offset is None or not offset.snapshot_complete) and mode.when_missing:
        unfinished = offset is not None and offset.snapshot.get("status") == "running"
        if unfinished and offset.snapshot.get("collections"):
            collections = tuple(offset.snapshot["collections"])
            return copy(collections, f"its snapshot of {', '.join(collections)} is unfinished: resuming it")
        if unfinished:
            return copy((), "its snapshot is unfinished: resuming it where it stopped")
        return copy((), "back after being retired: starting afresh" if fresh else "no completed snapshot")
    streaming = offset is not None and offset.resume_token is not None
    new = newly_captured(offset) if streaming and stream and mode.new_collections else ()
    if resnapshot is not None and resnapshot.covers(shard_id):
        # collections newly captured are copied with the requested ones
        collections = tuple(sorted(set(resnapshot.collections) | set(new))) if resnapshot.collections else ()
        return copy(collections, "re-snapshot requested by the trigger")
    heal = mode.when_position_lost and oplog_lost_recovery == HEAL_LOST_OPLOG
    if mode.when_position_lost and streaming and position_lost(offset):
        lost = f"its stored resume position is no longer in the oplog (snapshot.mode {snapshot_mode})"
        if not heal:
            return copy((), f"{lost}: copying every collection again (oplog.lost.recovery resnapshot)")
        why = f"{lost}: streaming from now and healing what differs (oplog.lost.recovery heal)"
        # collections newly captured have no state: the heal lands every document of theirs
        return ShardPlan(None, False, stream, False, fresh, why, recover=True)
    if heal and streaming and recovery_pending():
        why = "an earlier run's recovery from a lost oplog is unfinished: healing what differs"
        return ShardPlan(None, False, stream, False, fresh, why, recover=True)
    if new:
        return copy(
            new, f"the capture filters newly match {', '.join(new)}: copying them, streaming the rest"
        )
    start_without_copy = offset is None or offset.resume_token is None
    reason = (
        f"no snapshot (snapshot.mode {snapshot_mode}): streaming from its start position"
        if start_without_copy
        else "streaming"
    )
    return ShardPlan(None, start_without_copy, stream, False, fresh, reason)


def still_draining(offset: Offset | None) -> bool:
    """Whether a shard that left the cluster still has a stream to drain (an offset not retired yet)."""
    return offset is not None and not offset.retired_at
