"""Healing a shard whose stored position has left the oplog, instead of copying it again
(``snapshot.mode`` ``when_needed`` with ``oplog.lost.recovery`` ``heal``).

The events between the lake's position and the oplog's first entry are gone, but the lake already
holds nearly every document, and a verification can tell range by range which ones differ. So:

1. **Reposition** (``begin_recovery``, in ``snapshot_start``): a batch without rows of kind
   ``recover`` at "now" is committed like any batch, so the offset follows it and the run's pull
   streams from there. The batch before it holds where the lost stream stood: the two name the gap.
2. **Heal** (``verify.verification.verify_replica_set`` with ``recovery``, in the run's ``verify``,
   whatever ``verify.interval.hours`` and ``verify.on.drift`` say): every collection of the shard is
   compared with MongoDB at a position ``V`` after the pull, and each document that differs is read
   again and landed at ``V`` as the change its difference implies (``heal_op``): ``c`` for one the
   state lacks, ``u`` for one it holds differently, ``d`` for one MongoDB no longer has; its
   ``source.sequence`` is ``RECOVERY_SEQUENCE``, a value Debezium's MongoDB connector never sets, so
   a reader can tell them from streamed events. The repairs' batch is of kind ``heal``.
3. **Done** when a ``heal`` batch follows the last ``recover`` one (``recovery_pending``): the mark
   lives in the lake's batch log, not in the offset, so a run that fails between 1 and 2 (its pull,
   its verify, a collection that could not be verified) leaves the recovery pending, and the next
   run's plan heals again, from wherever the stream stands by then.

Why nothing is left out of the comparison, unlike a routine verification: its rule (a key with raw
rows the state has not applied, or with events from the stored position to ``V``, is the
transform's to fix) assumes the state plus those events is MongoDB, which the gap breaks: a key
whose missed events fell in the gap may also have later events, and an update without a full
document applied to a wrong version stays wrong. So every key that differs is healed. Its healing
row is at ``V``, after every pending row and every event up to ``V`` (those the next pull lands
too), so by the state's rule (newest position wins) the state ends as MongoDB had the document,
whatever order the rows are folded in; an event after ``V`` still wins. The price: a document
written after the new position and before ``V`` gets, besides its streamed events, one healing row
(the changes table shows both); one whose state differs only by raw rows not yet applied (a failed
transform before the gap) gets one too.
"""

from __future__ import annotations

import logging

from pymongo import MongoClient

from mongo_cdc.capture.change_cursor import op_time_of, token_cluster_time
from mongo_cdc.capture.offsets import Offset, OffsetKeeper
from mongo_cdc.capture.snapshot import current_position
from mongo_cdc.capture.streaming import resume_position_lost
from mongo_cdc.config.values import op_time_moment, op_time_text
from mongo_cdc.lake.batch_log import Batch
from mongo_cdc.lake.landing import SourceLake

log = logging.getLogger(__name__)

# the batch kinds: where the stream starts again after the gap, and the repairs that close it
RECOVER_BATCH = "recover"
HEAL_BATCH = "heal"
# ``source.sequence`` of a healing row (Debezium's MongoDB connector leaves it null)
RECOVERY_SEQUENCE = "recovery"


def recovery_pending(lake: SourceLake, rs: str) -> bool:
    """Whether ``rs``'s stream was started again after a lost oplog and not healed since: its last
    ``recover`` batch comes after its last ``heal`` batch."""
    last: dict[str, int] = {}
    for batch in lake.batches():
        if batch.rs == rs and batch.kind in (RECOVER_BATCH, HEAL_BATCH):
            last[batch.kind] = batch.seq
    return last.get(RECOVER_BATCH, 0) > last.get(HEAL_BATCH, 0)


def begin_recovery(client: MongoClient, rs: str, keeper: OffsetKeeper) -> Offset | None:
    """Start ``rs``'s stream again at "now" if its stored position has left the oplog: commit a
    ``recover`` batch there (the offset follows). None when the position is still in the oplog (a
    recovery pending from an earlier run goes on from where its stream stands)."""
    offset = keeper.load_checked()
    if offset is None or offset.resume_token is None or not resume_position_lost(client, offset.resume_token):
        return None
    token = current_position(client)
    # an open transaction's counters belong to the lost stream: the new one starts outside of it
    batch = Batch(rs, offset.next_seq, RECOVER_BATCH, token, token_cluster_time(token))
    recovered = keeper.commit_batch(offset, batch)
    lost, now = op_time_of(offset.resume_token), op_time_of(token)
    log.warning(
        "replica set %s: its position %s (%s) has left the oplog; the events from there to %s (%s) are "
        "gone. Streaming starts again at %s (batch %d, kind %s); this run's verify heals the documents "
        "that differ from MongoDB",
        rs, op_time_text(lost), op_time_moment(lost), op_time_text(now), op_time_moment(now),
        op_time_text(now), batch.seq, RECOVER_BATCH,
    )  # fmt: skip
    return recovered


def heal_op(in_state: bool, in_mongodb: bool) -> str | None:
    """The change a healed document's difference implies: ``c`` (MongoDB has it, the state lacks it),
    ``u`` (both have it, differently), ``d`` (the state has it, MongoDB not); None when neither has it
    (it came and went while it was verified)."""
    if in_mongodb:
        return "u" if in_state else "c"
    return "d" if in_state else None
