"""Views captured in batches: each read of a view lands its differences from the state as changes.

A view has no change stream (its documents are computed from other collections at each read), so
it is captured the way a verification heals drift: ``comparison.CollectionCheck`` reads the view
once and compares it with the view's state table by cells of ``_id`` digests; only the documents of
differing cells are compared one by one, and each difference lands, as a verification's repair does
(``verification.land_repairs``), as the change it implies (``oplog_recovery.heal_op``): ``c`` for a
document the state lacks, ``u`` for one it holds differently, ``d`` for one the view no longer has.
The rows are keyed by the view's ``_id`` (``collection_kinds`` refuses a view without a unique
one), their ``source.sequence`` is ``VIEW_SEQUENCE``, and the views' rows of one read are one batch
of kind ``collection_kinds.VIEW_BATCH`` at a position taken after the read, so a later read wins.
An unchanged view costs a read of it and of its state, and writes nothing: no batch, so the
transform has no work for it. The first read of a view lands every document as ``c``.

A view has no index of its own to cut into ``_id`` ranges (``chunking``): it is one range, read
whole, and its cells (``digest``) narrow what is compared document by document.

**Freshness.** A view's tables are as of its last read: the run's ``shard_sync.snapshot`` (every
``view.read.interval.runs`` scheduled runs, ``read_due``), and the transform of the same run.
A view whose last read is not applied yet (its transform failed) is not read again until it is, so
one difference never lands twice.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field

from mongo_cdc.capture.change_cursor import token_cluster_time
from mongo_cdc.capture.collection_kinds import VIEW_BATCH, dropped_since
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.snapshot import current_position
from mongo_cdc.lake.batch_log import Batch
from mongo_cdc.lake.verification_log import REPAIRED
from mongo_cdc.namespace import Namespace
from mongo_cdc.verify.comparison import CollectionCheck
from mongo_cdc.verify.verification import land_repairs

log = logging.getLogger(__name__)

# ``source.sequence`` of a view's row (Debezium's MongoDB connector leaves it null)
VIEW_SEQUENCE = "view"


@dataclass
class ViewReads:
    """What one run's reads of the views found: the changes landed per view and op (``c``, ``u``,
    ``d``), the batch that holds them (None: no view changed), and the views not read, with why."""

    changes: dict[str, dict[str, int]] = field(default_factory=dict)
    batch_seq: int | None = None
    not_read: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"changes": self.changes, "batch_seq": self.batch_seq, "not_read": self.not_read}


def read_due(every: int, interval_start: dt.datetime | None, interval_end: dt.datetime | None) -> bool:
    """Whether a run reads the views (``view.read.interval.runs`` = ``every``): a run without a data
    interval (a manual one) always does; a scheduled one when its interval starts on a multiple of
    ``every`` intervals since the epoch."""
    if every <= 1 or interval_start is None or interval_end is None or interval_end <= interval_start:
        return True
    length = (interval_end - interval_start).total_seconds()
    return int(interval_start.timestamp() // length) % every == 0


def capture_views(capture: ReplicaSetCapture, views: list[str]) -> ViewReads:
    """Read each of ``views`` (namespaces of the replica set ``capture`` reads) and land what
    differs from its state as one batch (the module doc)."""
    found = ViewReads()
    batches = capture.lake.batches()
    dropped = dropped_views(capture, batches, views)
    to_read = [*views, *dropped]
    if not to_read:
        return found
    offset = capture.keeper.load_checked()
    if offset is None or offset.resume_token is None or not offset.snapshot_complete:
        found.not_read = dict.fromkeys(to_read, "the replica set has no complete snapshot and position yet")
    elif capture.lake.last_planned_seq(capture.rs) > offset.batch_seq:
        found.not_read = dict.fromkeys(to_read, "a snapshot of the replica set is unfinished")
    if found.not_read:
        _log(found)
        return found
    repairs: dict[str, dict[str, object]] = {}
    in_state: dict[str, set[str]] = {}
    for namespace in to_read:
        db, name = Namespace.parse(namespace)
        if namespace in dropped:
            log.info("view %s is gone from MongoDB: the documents of its state land as deletes", namespace)
            options = {}  # a namespace MongoDB does not have reads as no documents
        else:
            info = next(capture.client[db].list_collections(filter={"name": name, "type": "view"}), None)
            if info is None:
                found.not_read[namespace] = "gone from MongoDB since discovery"
                continue
            options = info["options"]
        check = CollectionCheck(capture, namespace, options, batches, heal=True)
        reason = check.skipped or (
            "its last read is not applied to the state yet (see the transform's log)"
            if check.pending_keys
            else None
        )
        if reason is not None:
            found.not_read[namespace] = reason
            continue
        check.compare()
        drifted = check.settle(set(), REPAIRED)
        if not drifted:
            continue
        repairs[namespace], in_state[namespace] = drifted, check.in_state
        found.changes[namespace] = {
            op: total
            for op, total in (
                ("c", sum(report.missing for report in check.reports)),
                ("u", sum(report.different for report in check.reports)),
                ("d", sum(report.extra for report in check.reports)),
            )
            if total
        }
    if repairs:
        cluster_time = token_cluster_time(current_position(capture.client))
        found.batch_seq = land_repairs(
            capture, offset, repairs, cluster_time, in_state, VIEW_BATCH, VIEW_SEQUENCE
        )
    _log(found)
    return found


def dropped_views(capture: ReplicaSetCapture, batches: list[Batch], views: list[str]) -> list[str]:
    """The views earlier reads of the replica set landed that are dropped since (``dropped_since``):
    read as empty, their states' documents land as deletes, then nothing more."""
    landed = (
        namespace
        for batch in batches
        if batch.rs == capture.rs and batch.kind == VIEW_BATCH
        for namespace in batch.namespaces
    )
    return dropped_since(capture.client, capture.config, landed, views)


def _log(found: ViewReads) -> None:
    for namespace, ops in sorted(found.changes.items()):
        log.info("view %s: %s landed in batch %s", namespace,
                 ", ".join(f"{op}={n}" for op, n in sorted(ops.items())), found.batch_seq)  # fmt: skip
    for namespace, reason in sorted(found.not_read.items()):
        log.warning("view %s not read in this run: %s", namespace, reason)
