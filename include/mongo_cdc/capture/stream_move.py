"""An on-call move of a streaming replica set to another op-time (the trigger param ``stream_from``),
and the rule that keeps a replayed event from landing twice.

**Back** (an op-time before the lake's position, still in the oplog): the move is a batch without
rows of kind ``rewind`` at that op-time, committed like any batch, so the offset follows the lake and
the next pull reads from there. The events it reads again are the lake's already: a pull drops every
event at or before the replica set's **landed-through position**, the furthest resume token its
batches in the lake's batch log hold (``landed_through``). Resume tokens order as their events do
(their ``_data`` hex is a KeyString: byte order is stream order, events of one transaction apart by
their index, a high-water mark before the events of its op-time), so the rule is exact even inside
a transaction that a batch ended in. Without a move no event is at or before it: each stream
resumes after it. So no raw row, and so no change row or state version, lands twice.

**Forward** (past the lake's landed-through position): the events between would never be read.
Refused unless the trigger says ``skip_unread``; then the batch is of kind ``skip``, which records
it.

Either way the batch log keeps the move: the batch before it holds where the stream was.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from bson import Timestamp
from pymongo import MongoClient

from mongo_cdc.capture.change_cursor import op_time_of, op_time_position, token_cluster_time
from mongo_cdc.capture.offsets import Offset, OffsetError, OffsetKeeper
from mongo_cdc.capture.oplog_window import first_op_time_after
from mongo_cdc.config.values import op_time_moment, op_time_text
from mongo_cdc.lake.batch_log import Batch
from mongo_cdc.lake.landing import SourceLake

log = logging.getLogger(__name__)

REWIND, SKIP = "rewind", "skip"


@dataclass(frozen=True)
class StreamMoveRequest:
    """The trigger's move: to op-time ``to`` on these shards (empty: all); forward only with
    ``skip_unread``."""

    to: Timestamp
    skip_unread: bool = False
    shards: tuple[str, ...] = ()

    def covers(self, shard_id: str) -> bool:
        return not self.shards or shard_id in self.shards


class StreamMoveError(OffsetError):
    """A move the trigger asked for cannot be made; nothing was committed."""


def landed_through(lake: SourceLake, rs: str) -> str | None:
    """The ``_data`` of the furthest resume token the lake's batches of ``rs`` hold: every event at or
    before it is in the lake (None: no batch with a position)."""
    tokens = [
        batch.resume_token["_data"] for batch in lake.batches() if batch.rs == rs and batch.resume_token
    ]
    return max(tokens, default=None)


def move_stream(
    client: MongoClient, rs: str, keeper: OffsetKeeper, to: Timestamp, skip_unread: bool
) -> Offset:
    """Move ``rs``'s stream to op-time ``to``: back (the events from ``to`` read again, none landed
    twice), or forward past unread events when ``skip_unread`` allows it."""
    offset = keeper.load_checked()
    if offset is None or offset.resume_token is None:
        raise StreamMoveError(
            f"replica set {rs} has no stream to move yet (offset '{keeper.key}' holds no position); run "
            'once without "stream_from" first'
        )
    # forward of the lake's position, not the stream's: after a move back, a move short of where the
    # lake stands skips only events it holds
    now = op_time_of({"_data": landed_through(keeper.lake, rs) or offset.resume_token["_data"]})
    target = f"op-time {op_time_text(to)} ({op_time_moment(to)})"
    where = f"the lake holds its events up to {op_time_text(now)} ({op_time_moment(now)})"
    first = first_op_time_after(client, rs, to, 'param "stream_from"')
    if first is not None:
        raise StreamMoveError(
            f'replica set {rs}: param "stream_from" is {target}, older than the oplog\'s first entry, '
            f"{op_time_text(first)} ({op_time_moment(first)}): the events before it are gone. Trigger again "
            f'with "stream_from": "{op_time_text(first)}" or later; nothing was moved.'
        )
    forward = to > now
    if forward and not skip_unread:
        raise StreamMoveError(
            f'replica set {rs}: param "stream_from" is {target}, but {where}: moving forward skips the '
            'events between, which were never landed. Trigger again with "skip_unread": true to skip '
            "them (the batch log records it), or with an earlier op-time; nothing was moved."
        )
    token = op_time_position(client, to)
    kind = SKIP if forward else REWIND
    batch = Batch(rs, offset.next_seq, kind, token, token_cluster_time(token))
    moved = keeper.commit_batch(offset, batch)
    log.warning(
        "replica set %s: stream moved %s from %s to %s (batch %d, kind %s)%s",
        rs, "forward" if forward else "back", op_time_text(now), op_time_text(to), batch.seq, kind,
        ": the events between are skipped" if forward else ": the events the lake holds are not landed again",
    )  # fmt: skip
    return moved
