"""Change-stream micro-batches for one replica set, from its stored resume token up to "now".

A pull reads until the stream's position reaches the cluster time observed when the pull
started (so a scheduled run covers its whole data interval and a manual trigger lands every
write made before the click), landing at most ``max.batch.size`` events per micro-batch:
files first, then the offset (see ``offsets`` for the exactly-once protocol). When nothing
captured changed, the offset still advances to the post-batch resume token, so a quiet
collection never lets the stored token age out of the oplog.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from pymongo import MongoClient
from pymongo.errors import OperationFailure

from mongo_cdc.config import SourceConfig
from mongo_cdc.events import DATA_OPERATIONS, SourceInfo, change_rows, rows_to_table, token_cluster_time
from mongo_cdc.lake import hour_partition, pack_cluster_time, raw_collection_dir, raw_file_name
from mongo_cdc.landing import write_table
from mongo_cdc.offsets import Offset, OffsetError, OffsetKeeper

log = logging.getLogger(__name__)

POLL_INTERVAL_MS = 1000
CHANGE_STREAM_HISTORY_LOST = 286


class ResumeError(RuntimeError):
    """The stored position cannot be resumed from; the message says how to recover."""


@dataclass
class PullResult:
    rs: str
    batch_seq: int = 0
    cluster_time: int = 0
    batches: int = 0
    events: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(int)))
    newest_source_ts_ms: int | None = None
    ignored_operations: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def to_dict(self) -> dict[str, Any]:
        return {
            "rs": self.rs,
            "batch_seq": self.batch_seq,
            "cluster_time": self.cluster_time,
            "batches": self.batches,
            "events": {ns: dict(ops) for ns, ops in self.events.items()},
            "newest_source_ts_ms": self.newest_source_ts_ms,
            "ignored_operations": dict(self.ignored_operations),
        }


class _MicroBatch:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.events = 0

    def add(self, rows: list[dict[str, Any]]) -> None:
        self.rows.extend(rows)
        self.events += 1


def last_applied(client: MongoClient) -> int:
    """Packed cluster time of the newest oplog entry: every write acknowledged so far is at or before it.

    (The resume token of a fresh stream points one tick past it, and an idle replica set only moves
    past that with its 10-second no-op writes, so it would make a pull wait for nothing.)
    """
    applied = client.admin.command("ping")["operationTime"]
    return pack_cluster_time(applied.time, applied.inc)


def _land(
    keeper: OffsetKeeper, offset: Offset, config: SourceConfig, rs: str, batch: _MicroBatch, token: dict
) -> Offset:
    """Write one micro-batch (one file per collection and hour), then commit its resume token."""
    seq = offset.batch_seq + 1
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in batch.rows:
        source = row["source"]
        directory = os.path.join(
            raw_collection_dir(config.lake_root, config.topic_prefix, source["db"], source["collection"]),
            hour_partition(row["cluster_time"]),
        )
        groups[directory].append(row)
    paths = {
        directory: os.path.join(directory, raw_file_name(rs, seq, part))
        for part, directory in enumerate(groups)
    }
    offset = keeper.begin_batch(offset, list(paths.values()))
    for directory, rows in groups.items():
        write_table(paths[directory], rows_to_table(rows))
    return keeper.commit(offset, resume_token=token, cluster_time=token_cluster_time(token), batch_seq=seq)


def _watch_options(config: SourceConfig, offset: Offset) -> dict[str, Any]:
    options: dict[str, Any] = {
        "resume_after": offset.resume_token,
        "max_await_time_ms": POLL_INTERVAL_MS,
        "batch_size": config.max_batch_size,
    }
    if config.capture_mode == "change_streams_update_full":
        options["full_document"] = "updateLookup"
    return options


def pull_changes(client: MongoClient, config: SourceConfig, rs: str, keeper: OffsetKeeper) -> PullResult:
    """Stream one replica set from its committed position until it has caught up with now."""
    offset = keeper.load()
    if offset is None or offset.resume_token is None:
        raise OffsetError(
            f"offset '{keeper.key}' has no resume position yet; the snapshot step must run first "
            "(check snapshot.mode)"
        )
    offset = keeper.discard_uncommitted(offset)
    target = last_applied(client)
    source = SourceInfo(config.topic_prefix, rs)
    result = PullResult(rs=rs)
    batch = _MicroBatch()
    try:
        with client.watch(**_watch_options(config, offset)) as stream:
            while True:
                change = stream.try_next()
                if change is not None:
                    _collect(change, config, source, batch, result)
                    # strictly past the target: more events of one transaction share its cluster time
                    caught_up = token_cluster_time(change["_id"]) > target
                    if batch.events >= config.max_batch_size or (caught_up and batch.events):
                        offset = _land(keeper, offset, config, rs, batch, change["_id"])
                        result.batches += 1
                        batch = _MicroBatch()
                    if not caught_up:
                        continue
                token = stream.resume_token
                if batch.events:
                    offset = _land(keeper, offset, config, rs, batch, token)
                    result.batches += 1
                    batch = _MicroBatch()
                # An empty getMore means the server has nothing newer to show; reaching the target
                # position then proves every event up to it has been seen.
                if token_cluster_time(token) >= target:
                    if token != offset.resume_token:
                        offset = keeper.commit(
                            offset, resume_token=token, cluster_time=token_cluster_time(token)
                        )
                    break
    except OperationFailure as exc:
        if exc.code == CHANGE_STREAM_HISTORY_LOST:
            raise ResumeError(
                f"replica set {rs}: the stored resume position ({keeper.key}) is no longer in the oplog, so "
                "changes since then cannot be streamed. Take a new snapshot: delete that Variable "
                "and trigger the DAG again."
            ) from None
        raise
    result.batch_seq = offset.batch_seq
    result.cluster_time = offset.cluster_time or 0
    return result


def _collect(
    change: dict, config: SourceConfig, source: SourceInfo, batch: _MicroBatch, result: PullResult
) -> None:
    operation = change["operationType"]
    op = DATA_OPERATIONS.get(operation)
    if op is None:
        namespace = change.get("ns", {})
        if config.captures_database(namespace.get("db", "")):
            result.ignored_operations[operation] += 1
            log.warning("change stream event %s on %s is not captured yet", operation, namespace)
        return
    db, collection = change["ns"]["db"], change["ns"]["coll"]
    if op in config.skipped_operations or not config.captures_collection(db, collection):
        return
    rows = change_rows(change, source, config.tombstones_on_delete)
    batch.add(rows)
    result.events[f"{db}.{collection}"][op] += 1
    ts_ms = rows[0]["source"]["ts_ms"]
    if result.newest_source_ts_ms is None or ts_ms > result.newest_source_ts_ms:
        result.newest_source_ts_ms = ts_ms
