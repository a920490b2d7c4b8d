"""Where a replica set's stream starts when nothing is copied (``snapshot.mode`` ``no_data`` or
``never``): now, or where ``capture.start.op.time`` or ``capture.start.resume.token`` says.

The start is a batch without rows (kind ``start``) at that position, committed before any pull,
which then resumes after it as after any other batch: the batch log and the offset record where
the stream started, and a configured start also in the offset's ``snapshot.start``. An op-time
becomes a resume token of its own: the one a change stream opened at that op-time
(``startAtOperationTime``) reports before it reads anything, its high-water mark, after which a
stream resumes at the op-time itself, so the events of that op-time land too. A configured token
is taken as it is: the stream resumes after the event it names.

A configured start applies to a replica set the lake has never landed. One the lake holds batches
of (its offset deleted: a reset; a shard back from retirement) streams from now, as without the
keys: an earlier start would land again events the lake holds.

The start is checked against the oplog before it is committed: one older than the oplog's first
entry is refused, naming that entry's op-time, unless that entry is the replica set's initiation
(then nothing older ever existed: a shard added after the op-time). Reading the oplog needs
``find`` on ``local.oplog.rs`` (``oplog_window.first_op_time_after``).
"""

from __future__ import annotations

import logging

from bson import Timestamp
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from mongo_cdc.capture.change_cursor import op_time_of, op_time_position, token_cluster_time
from mongo_cdc.capture.offsets import Offset, OffsetKeeper
from mongo_cdc.capture.oplog_window import first_op_time_after
from mongo_cdc.capture.snapshot import current_position
from mongo_cdc.config import SourceConfig, SourceConfigError
from mongo_cdc.config.values import op_time_moment, op_time_text
from mongo_cdc.lake.batch_log import Batch

log = logging.getLogger(__name__)


class StreamStartError(SourceConfigError):
    """The configured start position cannot be streamed from; the message names the key and the fix."""


def start_without_snapshot(
    client: MongoClient, rs: str, keeper: OffsetKeeper, config: SourceConfig | None = None
) -> Offset:
    """Commit the position a replica set's stream starts from, copying nothing (a batch with no rows):
    ``config``'s ``capture.start.*`` position for a replica set the lake has never landed, else now
    (``config`` None: now)."""
    offset = keeper.load_checked() or keeper.next_offset()
    key = config.start_position_key if config is not None else None
    if key is not None and keeper.lake.last_batch(rs) is not None:
        log.warning(
            "replica set %s: the lake already holds its batches up to %d, so %s (for a replica set the "
            "lake has never landed) does not apply: streaming from now",
            rs, offset.batch_seq, key,
        )  # fmt: skip
        key = None
    snapshot: dict = {"status": "complete", "skipped": True}
    if key is None:
        token = current_position(client)
    else:
        token = _configured_position(client, rs, config)
        snapshot["start"] = {"from": key, "op_time": op_time_text(op_time_of(token))}
        log.info("replica set %s: streaming starts at op-time %s (%s)", rs, snapshot["start"]["op_time"], key)
    batch = Batch(
        rs=rs,
        seq=offset.next_seq,
        kind="start",
        resume_token=token,
        cluster_time=token_cluster_time(token),
    )
    return keeper.commit_batch(offset, batch, snapshot=snapshot, retired_at="")


def _configured_position(client: MongoClient, rs: str, config: SourceConfig) -> dict:
    """The resume token of the configured start, checked against the replica set's oplog."""
    if config.capture_start_op_time is not None:
        start, key = config.capture_start_op_time, "capture.start.op.time"
        _check_in_oplog(client, rs, config.path, key, start)
        return op_time_position(client, start)
    token, key = {"_data": config.capture_start_resume_token}, "capture.start.resume.token"
    _check_in_oplog(client, rs, config.path, key, op_time_of(token))
    try:
        with client.watch(resume_after=token, batch_size=0):
            pass
    except OperationFailure as exc:
        raise StreamStartError(
            f"{config.path}: key '{key}' is not a resume token replica set {rs} can resume after "
            f"({(exc.details or {}).get('errmsg', exc)}); copy the _data of a change event's _id from "
            "this deployment, or use capture.start.op.time"
        ) from None
    return token


def _check_in_oplog(client: MongoClient, rs: str, path: str, key: str, start: Timestamp) -> None:
    """Refuse a start older than the oplog's first entry: the events between are gone."""
    first = first_op_time_after(client, rs, start, f"{path}'s key '{key}'")
    if first is None:
        return
    start_text, first_text = (f"{op_time_text(t)} ({op_time_moment(t)})" for t in (start, first))
    raise StreamStartError(
        f"{path}: replica set {rs}: key '{key}' is at op-time {start_text}, "
        f"older than the oplog's first entry, {first_text}: the events before it are gone, so the "
        f"stream cannot start there. Set capture.start.op.time to '{op_time_text(first)}' or "
        "later (and drop capture.start.resume.token), or copy the collections instead (snapshot.mode "
        "initial, without the key)."
    )
