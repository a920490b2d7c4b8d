"""Initial snapshot of one replica set: record the position, then copy every captured collection.

The position is taken *before* the copy, and streaming later resumes from it, so a write made
while the copy runs is either in the copy, or in the stream, or both (replay is harmless: state
applies events by oplog order) — never in neither.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import threading
import time
from collections.abc import Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from pymongo import MongoClient
from pymongo.collection import Collection

from mongo_cdc.config import SourceConfig
from mongo_cdc.events import SnapshotColumns, SourceInfo, token_cluster_time
from mongo_cdc.lake import highest_raw_seq, hour_partition, raw_collection_dir, raw_file_name
from mongo_cdc.landing import ROW_GROUP_ROWS, StreamingFileWriter
from mongo_cdc.offsets import Offset, OffsetKeeper
from mongo_cdc.topology import OwnedRanges, owned_ranges

log = logging.getLogger(__name__)

# Rows per raw file; a larger collection is split into parts so no single file grows unbounded.
ROWS_PER_FILE = 2_000_000
PROGRESS_INTERVAL_S = 10.0


@dataclass
class SnapshotResult:
    seq: int
    cluster_time: int
    documents: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.documents.values())


def needs_snapshot(offset: Offset | None, mode: str) -> bool:
    """Whether this replica set must copy its data before streaming (Debezium's snapshot.mode)."""
    if offset is not None and offset.snapshot_complete and not offset.retired_at:
        return False
    return mode in ("initial", "initial_only")


def current_position(client: MongoClient) -> dict:
    """A resume token for "now": the post-batch resume token of an empty change stream."""
    with client.watch(max_await_time_ms=1) as stream:
        stream.try_next()
        return stream.resume_token


def captured_collections(client: MongoClient, config: SourceConfig) -> list[tuple[str, str]]:
    found = []
    for db in client.list_database_names():
        if not config.captures_database(db):
            continue
        for info in client[db].list_collections(filter={"type": "collection"}):
            if config.captures_collection(db, info["name"]):
                found.append((db, info["name"]))
    return sorted(found)


class _Progress:
    def __init__(self, total_collections: int) -> None:
        self.total = total_collections
        self.done = 0
        self.documents = 0
        self.started = time.monotonic()
        self._last_log = self.started
        self._lock = threading.Lock()

    def add(self, documents: int, collection_done: bool = False) -> None:
        with self._lock:
            self.documents += documents
            self.done += collection_done
            now = time.monotonic()
            if collection_done or now - self._last_log >= PROGRESS_INTERVAL_S:
                self._last_log = now
                rate = self.documents / max(now - self.started, 1e-9)
                log.info(
                    "snapshot progress: %d/%d collections done, %d documents copied, %.0f docs/s",
                    self.done, self.total, self.documents, rate,
                )


def _documents(collection: Collection, fetch_size: int, owned: OwnedRanges | None) -> Generator[dict, None, None]:
    """All documents; for a sharded collection only those in the owned chunk ranges (shard key index)."""
    if owned is None:
        with collection.find({}, batch_size=fetch_size) as cursor:
            yield from cursor
        return
    for low, high in owned.ranges:
        cursor = collection.find({}, batch_size=fetch_size).min(list(low.items())).max(list(high.items()))
        with cursor.hint(list(owned.key)) as ranged:
            yield from ranged


def _copy_collection(
    client: MongoClient,
    config: SourceConfig,
    source: SourceInfo,
    db: str,
    collection: str,
    owned: OwnedRanges | None,
    seq: int,
    cluster_time: int,
    progress: _Progress,
) -> int:
    directory = os.path.join(
        raw_collection_dir(config.lake_root, config.topic_prefix, db, collection), hour_partition(cluster_time)
    )
    block = source.block(db, collection, cluster_time, (cluster_time >> 32) * 1000, snapshot=True)
    buffer = SnapshotColumns(block, cluster_time)
    documents = _documents(client[db][collection], config.snapshot_fetch_size, owned)
    writer: StreamingFileWriter | None = None
    part = copied = 0
    try:
        for document in documents:
            buffer.add(document)
            if len(buffer) >= ROW_GROUP_ROWS:
                if writer is not None and writer.rows >= ROWS_PER_FILE:
                    writer.close()
                    writer, part = None, part + 1
                if writer is None:
                    writer = StreamingFileWriter(os.path.join(directory, raw_file_name(source.rs, seq, part)))
                copied += len(buffer)
                progress.add(len(buffer))
                writer.write(buffer.take_table())
        if len(buffer):
            if writer is None:
                writer = StreamingFileWriter(os.path.join(directory, raw_file_name(source.rs, seq, part)))
            copied += len(buffer)
            progress.add(len(buffer))
            writer.write(buffer.take_table())
        if writer is not None:
            writer.close()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    finally:
        documents.close()
    progress.add(0, collection_done=True)
    return copied


def run_snapshot(
    client: MongoClient,
    config: SourceConfig,
    rs: str,
    keeper: OffsetKeeper,
    cluster: MongoClient | None = None,
    shard_id: str | None = None,
) -> SnapshotResult:
    """Copy every captured collection as ``op: r`` events and commit the pre-copy position.

    For one shard of a cluster, ``cluster`` (config server or router) and ``shard_id`` restrict
    sharded collections to the chunk ranges the shard owns, so orphaned documents are not emitted.
    """
    # a shard that returns after being retired starts afresh, its batch numbers still increasing
    offset = replace(_stored_or_new(keeper, config, rs), retired_at="")
    offset = keeper.discard_uncommitted(offset)
    token = current_position(client)
    cluster_time = token_cluster_time(token)
    collections = captured_collections(client, config)
    seq = offset.batch_seq + 1
    hour = hour_partition(cluster_time)
    pending = [
        os.path.join(raw_collection_dir(config.lake_root, config.topic_prefix, db, coll), hour, f"{rs}-{seq:012d}-*.parquet")
        for db, coll in collections
    ]
    snapshot_info = {"status": "running", "seq": seq, "cluster_time": cluster_time}
    offset = keeper.begin_batch(replace(offset, snapshot=snapshot_info), pending)
    log.info("snapshot of %s: %d collections from position %s", rs, len(collections), token["_data"][:18])
    source = SourceInfo(config.topic_prefix, rs)
    progress = _Progress(len(collections))
    result = SnapshotResult(seq=seq, cluster_time=cluster_time)
    with ThreadPoolExecutor(max_workers=config.snapshot_max_threads, thread_name_prefix="snapshot") as pool:
        futures = {
            f"{db}.{coll}": pool.submit(
                _copy_collection,
                client,
                config,
                source,
                db,
                coll,
                owned_ranges(cluster, shard_id, db, coll) if cluster is not None else None,
                seq,
                cluster_time,
                progress,
            )
            for db, coll in collections
        }
        for namespace, future in futures.items():
            result.documents[namespace] = future.result()
    result.seconds = time.monotonic() - progress.started
    keeper.commit(
        offset,
        resume_token=token,
        cluster_time=cluster_time,
        batch_seq=seq,
        snapshot={
            "status": "complete",
            "seq": seq,
            "cluster_time": cluster_time,
            "documents": result.total,
            "completed_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        },
    )
    log.info(
        "snapshot of %s complete: %d documents in %.1fs (%.0f docs/s)",
        rs, result.total, result.seconds, result.total / max(result.seconds, 1e-9),
    )
    return result


def _stored_or_new(keeper: OffsetKeeper, config: SourceConfig, rs: str) -> Offset:
    """The stored offset, or a new one numbering batches after any this replica set already landed."""
    return keeper.load() or Offset(batch_seq=highest_raw_seq(config.lake_root, config.topic_prefix, rs))


def start_without_snapshot(client: MongoClient, config: SourceConfig, rs: str, keeper: OffsetKeeper) -> Offset:
    """snapshot.mode never/no_data: stream from now on, copying nothing."""
    offset = _stored_or_new(keeper, config, rs)
    token = current_position(client)
    return keeper.commit(
        offset,
        resume_token=token,
        cluster_time=token_cluster_time(token),
        snapshot={"status": "complete", "skipped": True},
        retired_at="",
    )
