"""Initial snapshot of one replica set: record the position, then copy every captured collection.

The position is taken *before* the copy, and streaming later resumes from it, so a write made
while the copy runs is either in the copy, or in the stream, or both (replay is harmless: state
applies events by oplog order) — never in neither.

A re-snapshot (on request, or under ``when_needed`` once the stored position has left the oplog)
is the same copy. Each collection's copy is one Delta commit of the snapshot's batch; the batch
log's row then commits the batch with its manifest (the collections it copied completely), so the
transform can drop the documents that no longer exist.
"""

from __future__ import annotations

import datetime as dt
import logging
import struct
import threading
import time
from collections.abc import Generator, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa
from bson import _array_of_documents_to_buffer
from bson.codec_options import CodecOptions
from bson.raw_bson import _RAW_ARRAY_BSON_OPTIONS, RawBSONDocument
from pymongo import MongoClient
from pymongo.collection import Collection
from pymongo.cursor import RawBatchCursor
from pymongo.errors import OperationFailure

from mongo_cdc.capture_modes import captured_collection_options, require_images
from mongo_cdc.config import SourceConfig
from mongo_cdc.events import SnapshotColumns, SourceInfo, token_cluster_time
from mongo_cdc.lake import RAW_SCHEMA
from mongo_cdc.landing import Batch, SourceLake
from mongo_cdc.offsets import Offset, OffsetKeeper
from mongo_cdc.streaming import CHANGE_STREAM_HISTORY_LOST
from mongo_cdc.topology import OwnedRanges, owned_ranges

log = logging.getLogger(__name__)

# Rows per Arrow batch handed to delta-rs at most; a batch never spans two server batches, so the
# BSON behind it is at most one reply (16 MiB).
ROW_GROUP_ROWS = 50_000
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
                    self.done,
                    self.total,
                    self.documents,
                    rate,
                )


# Sizes of the BSON values a cursor reply's top level and cursor document hold (by type byte):
# fixed sizes, or -1 for an int32 length prefix counting itself (documents, arrays) and -4 for one
# that does not (strings: + terminator; binaries: + subtype byte).
_VALUE_SIZES = {0x01: 8, 0x02: -4, 0x03: -1, 0x04: -1, 0x05: -5, 0x07: 12, 0x08: 1, 0x09: 8, 0x0A: 0,
                0x10: 4, 0x11: 8, 0x12: 8, 0x13: 16}  # fmt: skip
_EMPTY_ARRAY = b"\x05\x00\x00\x00\x00"
_int32 = struct.Struct("<i")


def _elements(data: memoryview, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """(name, value start, value end) of the elements of the BSON document at ``data[start:end]``;
    stops early (the caller falls back) at a type this walk does not know."""
    pos = start + 4
    while pos < end - 1:
        kind = data[pos]
        name_end = data[pos + 1 : min(end, pos + 1025)].tobytes().index(b"\x00") + pos + 1
        value = name_end + 1
        size = _VALUE_SIZES.get(kind)
        if size is None:
            return
        if size == -1:
            size = _int32.unpack_from(data, value)[0]
        elif size < -1:
            size = _int32.unpack_from(data, value)[0] + 4 + (size == -5)
        yield bytes(data[pos + 1 : name_end]), value, value + size
        pos = value + size


def _without_batch(payload: memoryview) -> tuple[bytes, memoryview, str] | None:
    """The reply with its cursor's batch array emptied, the array's bytes and the batch's name."""
    for name, start, end in _elements(payload, 0, len(payload)):
        if name != b"cursor":
            continue
        for key, array_start, array_end in _elements(payload, start, end):
            if key in (b"firstBatch", b"nextBatch"):
                removed = (array_end - array_start) - len(_EMPTY_ARRAY)
                small = bytearray(payload[:array_start])
                small += _EMPTY_ARRAY
                small += payload[array_end:]
                _int32.pack_into(small, 0, len(payload) - removed)
                _int32.pack_into(small, start, end - start - removed)
                return bytes(small), payload[array_start:array_end], key.decode()
    return None


class _RawBatchCursor(RawBatchCursor):
    """``find_raw_batches`` without pymongo's per-document cost; the batches are the same bytes.

    pymongo 4 unpacks every reply by decoding the batch array into one ``RawBSONDocument`` per
    document and joining their bytes again: ~1.7 µs of GIL-holding work per document, a quarter of
    a snapshot's budget. Here the reply is decoded with its batch array cut out (walking its few
    top-level elements), and the array's bytes are turned into the document stream in C: one copy
    of the batch, where inflating the reply with raw arrays made three.
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
        cut = None if legacy_response or payload is None else _without_batch(memoryview(payload))
        if cut is None:  # not an OP_MSG cursor reply this walk reads: pymongo's own way
            return super()._unpack_response(response, cursor_id, codec_options, user_fields, legacy_response)
        small, array, key = cut
        reply = dict(RawBSONDocument(small, _RAW_ARRAY_BSON_OPTIONS).items())
        cursor = reply["cursor"] = dict(reply["cursor"].items())
        stream = _array_of_documents_to_buffer(array)
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


def _copy_collection(
    client: MongoClient,
    config: SourceConfig,
    source_lake: SourceLake,
    source: SourceInfo,
    db: str,
    collection: str,
    owned: OwnedRanges | None,
    seq: int,
    cluster_time: int,
    progress: _Progress,
) -> int:
    """Copy one collection into its raw table as one commit of batch ``seq``: the snapshot's hot loop.

    Batches arrive as raw BSON (no per-document cursor objects) and become Arrow batches of at most
    ``ROW_GROUP_ROWS`` rows without decoding a document (``events.SnapshotColumns``).
    """
    block = source.block(db, collection, cluster_time, (cluster_time >> 32) * 1000, snapshot=True)
    fields = config.field_filters.for_collection(db, collection)
    columns = SnapshotColumns(block, cluster_time, seq, fields, max_rows=ROW_GROUP_ROWS)
    batches = _raw_batches(client[db].get_collection(collection), config.snapshot_fetch_size, owned)
    copied = 0

    def tables(prefetched: Iterator[bytes]) -> Generator[pa.RecordBatch, None, None]:
        nonlocal copied
        for batch in prefetched:
            for rows in columns.record_batches(batch):
                copied += rows.num_rows
                progress.add(rows.num_rows)
                yield rows

    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"snapshot-{db}.{collection}") as fetcher:
            rows = tables(_prefetched(batches, fetcher))
            first = next(rows, None)
            if first is not None:  # an empty collection gets no commit: its manifest says it is empty
                reader = pa.RecordBatchReader.from_batches(RAW_SCHEMA, _chain(first, rows))
                source_lake.write_raw(source.rs, seq, f"{db}.{collection}", reader)
    finally:
        batches.close()
    progress.add(0, collection_done=True)
    return copied


def _chain(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]) -> Generator[pa.RecordBatch, None, None]:
    yield first
    yield from rest


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
    stored = keeper.load_checked() or keeper.next_offset()
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
    offset = replace(stored, retired_at="")
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
    snapshot_info = {
        "status": "running",
        "seq": seq,
        "cluster_time": cluster_time,
        "back_from_retirement": back_from_retirement,
    }
    offset = keeper.commit(offset, snapshot=snapshot_info)
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
                keeper.lake,
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
    copied = tuple(f"{db}.{coll}" for db, coll in collections)
    position = (stored.resume_token, stored.cluster_time) if keeps_position else (token, cluster_time)
    batch = Batch(
        rs=rs,
        seq=seq,
        kind="snapshot",
        resume_token=position[0],
        cluster_time=position[1],
        snapshot_cluster_time=cluster_time,
        collections=None if back_from_retirement else copied,
        namespaces=tuple(namespace for namespace, count in result.documents.items() if count),
        open_transaction=stored.open_transaction if keeps_position else None,
    )
    snapshot_info = {
        "status": "complete",
        "seq": seq,
        "cluster_time": cluster_time,
        "documents": result.total,
        "completed_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if keeps_position:
        snapshot_info["collections"] = list(copied)
    keeper.commit_batch(offset, batch, snapshot=snapshot_info)
    log.info(
        "snapshot of %s complete: %d documents in %.1fs (%.0f docs/s)",
        rs,
        result.total,
        result.seconds,
        result.total / max(result.seconds, 1e-9),
    )
    return result


def start_without_snapshot(client: MongoClient, rs: str, keeper: OffsetKeeper) -> Offset:
    """snapshot.mode never/no_data: stream from now on, copying nothing (a batch with no rows)."""
    offset = keeper.load_checked() or keeper.next_offset()
    token = current_position(client)
    batch = Batch(
        rs=rs,
        seq=offset.batch_seq + 1,
        kind="start",
        resume_token=token,
        cluster_time=token_cluster_time(token),
    )
    return keeper.commit_batch(offset, batch, snapshot={"status": "complete", "skipped": True}, retired_at="")
