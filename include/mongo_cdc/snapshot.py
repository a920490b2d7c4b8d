"""Initial snapshot of one replica set: record the position, then copy every captured collection.

The position is taken *before* the copy, and streaming later resumes from it, so a write made
while the copy runs is either in the copy, or in the stream, or both (replay is harmless: state
applies events by oplog order) — never in neither.

A re-snapshot (on request, or under ``when_needed`` once the stored position has left the oplog)
is the same copy. Each snapshot batch also lands a manifest naming the collections it copied
completely, so the transform can drop the documents that no longer exist.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import struct
import threading
import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import bson
import pyarrow as pa
from bson import _array_of_documents_to_buffer
from bson.codec_options import CodecOptions
from bson.errors import InvalidBSON
from bson.raw_bson import _RAW_ARRAY_BSON_OPTIONS, RawBSONDocument
from pymongo import MongoClient
from pymongo.collection import Collection
from pymongo.cursor import RawBatchCursor
from pymongo.errors import OperationFailure

from mongo_cdc.capture_modes import captured_collection_options, require_images
from mongo_cdc.config import SourceConfig
from mongo_cdc.events import SnapshotColumns, SourceInfo, token_cluster_time
from mongo_cdc.extjson import DECODE_OPTIONS
from mongo_cdc.lake import (
    SnapshotManifest,
    highest_raw_seq,
    hour_partition,
    raw_collection_dir,
    raw_file_name,
    snapshot_manifest_path,
    write_snapshot_manifest,
)
from mongo_cdc.landing import ROW_GROUP_BYTES, ROW_GROUP_ROWS, StreamingFileWriter
from mongo_cdc.offsets import Offset, OffsetKeeper
from mongo_cdc.streaming import CHANGE_STREAM_HISTORY_LOST
from mongo_cdc.topology import OwnedRanges, owned_ranges

log = logging.getLogger(__name__)

# Rows per raw file; a larger collection is split into parts so no single file grows unbounded.
ROWS_PER_FILE = 2_000_000
# Documents decoded at a time: few enough that they are freed before the cyclic GC looks at them.
# (Decoding a whole 16 MB batch keeps ~100k dicts alive and the GC passes over them cost ~3x the decode.)
DECODE_CHUNK = 64
_document_size = struct.Struct("<i").unpack_from
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
    """Whether this replica set must copy its data before streaming (Debezium's snapshot.mode).

    ``when_needed`` also re-snapshots when the stored position has left the oplog, which only the
    server can tell (``resume_position_lost``).
    """
    if mode == "always":
        return True
    if offset is not None and offset.snapshot_complete and not offset.retired_at:
        return False
    return mode in ("initial", "when_needed", "initial_only")


def current_position(client: MongoClient) -> dict:
    """A resume token for "now": the post-batch resume token of an empty change stream."""
    with client.watch(max_await_time_ms=1) as stream:
        stream.try_next()
        return stream.resume_token


def resume_position_lost(client: MongoClient, token: dict) -> bool:
    """Whether a change stream can no longer resume after ``token`` (the oplog was truncated past it)."""
    try:
        with client.watch(resume_after=token, max_await_time_ms=1, batch_size=1) as stream:
            stream.try_next()
    except OperationFailure as exc:
        if exc.code == CHANGE_STREAM_HISTORY_LOST:
            return True
        raise
    return False


def captured_collections(client: MongoClient, config: SourceConfig) -> list[tuple[str, str]]:
    return sorted((db, collection) for db, collection, _ in captured_collection_options(client, config))


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


class _RawBatchCursor(RawBatchCursor):
    """``find_raw_batches`` without pymongo's per-document cost; the batches are the same bytes.

    pymongo 4 unpacks every reply by decoding the batch array into one ``RawBSONDocument`` per
    document and joining their bytes again: ~1.7 µs of GIL-holding work per document, a quarter of
    a snapshot's budget. Here the array's bytes are taken whole (the cursor/array documents are
    inflated with raw arrays) and turned into the document stream in C.
    """

    def _unpack_response(  # type: ignore[override]
        self,
        response: Any,
        cursor_id: int | None,
        codec_options: CodecOptions,
        user_fields: Mapping[str, Any] | None = None,
        legacy_response: bool = False,
    ) -> list[Any]:
        payload = getattr(response, "payload_document", None)
        if legacy_response or payload is None:  # not an OP_MSG reply: pymongo's own way
            return super()._unpack_response(response, cursor_id, codec_options, user_fields, legacy_response)
        reply = dict(RawBSONDocument(payload, _RAW_ARRAY_BSON_OPTIONS).items())
        if isinstance(reply.get("cursor"), RawBSONDocument):
            cursor = reply["cursor"] = dict(reply["cursor"].items())
            for key in ("firstBatch", "nextBatch"):
                if key in cursor:  # the raw bytes of the BSON array of documents
                    stream = _array_of_documents_to_buffer(cursor[key])
                    cursor[key] = [stream] if stream else []
        return [reply]


def _raw_batches(
    collection: Collection, fetch_size: int, owned: OwnedRanges | None
) -> Generator[bytes, None, None]:
    """All documents as raw batches (concatenated BSON); for a sharded collection only those in the
    owned chunk ranges (shard key index)."""
    if owned is None:
        with _RawBatchCursor(collection, {}, batch_size=fetch_size) as cursor:
            yield from cursor
        return
    for low, high in owned.ranges:
        cursor = _RawBatchCursor(collection, {}, batch_size=fetch_size)
        cursor = cursor.min(list(low.items())).max(list(high.items()))
        with cursor.hint(list(owned.key)) as ranged:
            yield from ranged


def _prefetched(batches: Iterator[bytes], fetcher: ThreadPoolExecutor) -> Generator[bytes, None, None]:
    """``batches``, the next one being read from MongoDB (socket I/O, no GIL) while this one is encoded."""
    ahead = fetcher.submit(next, batches, None)
    while (batch := ahead.result()) is not None:
        ahead = fetcher.submit(next, batches, None)
        yield batch


class _RawParts:
    """The raw files of one collection: row groups are written by a background thread (Parquet
    encoding and compression release the GIL) while the next group is encoded; a new part starts
    once a file holds ``ROWS_PER_FILE`` rows. At most one group is in flight, so memory stays bounded."""

    def __init__(self, directory: str, rs: str, seq: int, pool: ThreadPoolExecutor) -> None:
        self._directory, self._rs, self._seq, self._pool = directory, rs, seq, pool
        self._part = 0
        self._writer: StreamingFileWriter | None = None
        self._in_flight: Future | None = None

    def write(self, table: pa.Table) -> None:
        self._wait()
        if self._writer is not None and self._writer.rows >= ROWS_PER_FILE:
            self._writer.close()
            self._writer, self._part = None, self._part + 1
        if self._writer is None:
            name = raw_file_name(self._rs, self._seq, self._part)
            self._writer = StreamingFileWriter(os.path.join(self._directory, name))
        self._in_flight = self._pool.submit(self._writer.write, table)

    def close(self) -> None:
        self._wait()
        if self._writer is not None:
            self._writer.close()

    def abort(self) -> None:
        try:
            self._wait()
        except BaseException:
            pass  # the error that made us abort is what the caller reports
        if self._writer is not None:
            self._writer.abort()

    def _wait(self) -> None:
        if self._in_flight is not None:
            in_flight, self._in_flight = self._in_flight, None
            in_flight.result()


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
    """Copy one collection into raw files: the snapshot's hot loop.

    Batches arrive as raw BSON (no per-document cursor objects) and are decoded ``DECODE_CHUNK``
    documents at a time, then encoded straight to Extended JSON (``extjson.encode``, never
    ``json_util``). Row groups hold ``ROW_GROUP_ROWS`` rows, fewer when their documents reach
    ``ROW_GROUP_BYTES``.
    """
    directory = os.path.join(
        raw_collection_dir(config.lake_root, config.topic_prefix, db, collection),
        hour_partition(cluster_time),
    )
    block = source.block(db, collection, cluster_time, (cluster_time >> 32) * 1000, snapshot=True)
    buffer = SnapshotColumns(block, cluster_time, config.field_filters.for_collection(db, collection))
    batches = _raw_batches(client[db].get_collection(collection), config.snapshot_fetch_size, owned)
    copied = group_bytes = 0
    try:
        with ThreadPoolExecutor(max_workers=2, thread_name_prefix=f"snapshot-{db}.{collection}") as helpers:
            parts = _RawParts(directory, source.rs, seq, helpers)
            try:
                for batch in _prefetched(batches, helpers):
                    view, pos, end = memoryview(batch), 0, len(batch)
                    while pos < end:
                        start, room = pos, min(DECODE_CHUNK, ROW_GROUP_ROWS - len(buffer))
                        while room and pos < end:
                            pos += _document_size(batch, pos)[0]
                            room -= 1
                        if not start < pos <= end:
                            raise InvalidBSON(f"bad document length in a batch of {db}.{collection}")
                        buffer.extend(bson.decode_all(view[start:pos], DECODE_OPTIONS))
                        group_bytes += pos - start
                        if len(buffer) >= ROW_GROUP_ROWS or group_bytes >= ROW_GROUP_BYTES:
                            copied += len(buffer)
                            progress.add(len(buffer))
                            parts.write(buffer.take_table())
                            group_bytes = 0
                if len(buffer):
                    copied += len(buffer)
                    progress.add(len(buffer))
                    parts.write(buffer.take_table())
                parts.close()
            except BaseException:
                parts.abort()
                raise
    finally:
        batches.close()
    progress.add(0, collection_done=True)
    return copied


def run_snapshot(
    client: MongoClient,
    config: SourceConfig,
    rs: str,
    keeper: OffsetKeeper,
    cluster: MongoClient | None = None,
    shard_id: str | None = None,
    only: Sequence[str] = (),
) -> SnapshotResult:
    """Copy every captured collection as ``op: r`` events and commit the pre-copy position.

    ``snapshot.include.collection.list`` narrows the copy to the collections it matches; a replica
    set that already streams then keeps its position, like a re-snapshot of some collections.

    For one shard of a cluster, ``cluster`` (config server or router) and ``shard_id`` restrict
    sharded collections to the chunk ranges the shard owns, so orphaned documents are not emitted.

    ``only`` (``<db>.<collection>`` names) re-snapshots just those collections of a replica set
    that already streams. Its resume position then stays where it is, so the other collections
    miss no event; for the copied ones the stream replays events older than the copy, which the
    state skips. Without a streaming position to keep, every captured collection is copied.
    """
    require_images(client, config, rs)
    stored = _stored_or_new(keeper, config, rs)
    streams = stored.snapshot_complete and stored.resume_token is not None and not stored.retired_at
    # With snapshot.include.collection.list the collections left out are only streamed: moving the
    # position to this copy would skip their events since the stored one, so it stays when it can.
    keeps_position = streams and (
        bool(only)
        or (bool(config.snapshot_include) and not resume_position_lost(client, stored.resume_token))
    )
    if only and not keeps_position:
        log.info("replica set %s has no streaming position to keep: snapshotting every collection", rs)
    # a shard that returns after being retired starts afresh, its batch numbers still increasing
    offset = keeper.discard_uncommitted(replace(stored, retired_at=""))
    token = current_position(client)
    cluster_time = token_cluster_time(token)
    if keeps_position and only:
        collections = sorted((db, coll) for db, _, coll in (name.partition(".") for name in only))
    else:
        captured = captured_collections(client, config)
        collections = [(db, coll) for db, coll in captured if config.snapshots_collection(db, coll)]
    seq = offset.batch_seq + 1
    # The manifest lets the transform drop the documents this copy no longer finds. A shard back
    # from retirement has none to drop: what it held before was all migrated to other shards, yet
    # still counts as its own (migrations emit no events). The running offset keeps the flag for a
    # retry of such a copy.
    back_from_retirement = bool(stored.retired_at) or stored.snapshot.get("back_from_retirement", False)
    manifest = SnapshotManifest(rs, seq, cluster_time, tuple(f"{db}.{coll}" for db, coll in collections))
    hour = hour_partition(cluster_time)
    pending = [
        os.path.join(
            raw_collection_dir(config.lake_root, config.topic_prefix, db, coll),
            hour,
            f"{rs}-{seq:012d}-*.parquet",
        )
        for db, coll in collections
    ]
    if not back_from_retirement:
        pending.append(snapshot_manifest_path(config.lake_root, config.topic_prefix, rs, seq))
    snapshot_info = {
        "status": "running",
        "seq": seq,
        "cluster_time": cluster_time,
        "back_from_retirement": back_from_retirement,
    }
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
    if not back_from_retirement:
        write_snapshot_manifest(config.lake_root, config.topic_prefix, manifest)
    snapshot_info = {
        "status": "complete",
        "seq": seq,
        "cluster_time": cluster_time,
        "documents": result.total,
        "completed_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    position = {"resume_token": token, "cluster_time": cluster_time}
    if keeps_position:
        snapshot_info["collections"] = list(manifest.collections)
        position = {}
    keeper.commit(offset, batch_seq=seq, snapshot=snapshot_info, **position)
    log.info(
        "snapshot of %s complete: %d documents in %.1fs (%.0f docs/s)",
        rs, result.total, result.seconds, result.total / max(result.seconds, 1e-9),
    )
    return result


def _stored_or_new(keeper: OffsetKeeper, config: SourceConfig, rs: str) -> Offset:
    """The stored offset, or a new one numbering batches after any this replica set already landed."""
    return keeper.load() or Offset(batch_seq=highest_raw_seq(config.lake_root, config.topic_prefix, rs))


def start_without_snapshot(
    client: MongoClient, config: SourceConfig, rs: str, keeper: OffsetKeeper
) -> Offset:
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
