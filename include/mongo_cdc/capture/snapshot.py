"""Snapshots of one replica set: record the position, then copy the captured collections in chunks.

The position is taken *before* the copy, and streaming later resumes from it, so a write made
while the copy runs is either in the copy, or in the stream, or both (replay is harmless: state
applies events by oplog order) — never in neither. However long the copy takes, and however many
attempts it needs, every snapshot row carries that position.

A snapshot is three steps; the DAG runs them as separate tasks, ``run_snapshot`` in one go:

1. ``start_snapshot`` records the position (the offset's running snapshot), splits each collection
   into chunks of about ``snapshot.chunk.size`` documents (``chunking``) and records that plan in
   the lake, or returns the plan of an unfinished snapshot that can still be resumed;
2. ``copy_chunks`` copies chunks, each one Delta commit of its raw table (``landing``), and records
   them in the snapshot log a copier's worth at a time. A chunk already committed is skipped, so a
   retry re-reads only the missing ones; chunks are independent, so several tasks, and
   ``snapshot.max.threads`` threads in each, copy one snapshot;
3. ``commit_snapshot``, once every chunk is copied, commits the snapshot's batch with its manifest
   (the collections it copied completely), so the transform can drop the documents that no longer
   exist, and moves the offset.

The shard's pull goes on while the chunks are copied (the DAG commits after both). Its batches
never take the number the snapshot reserved for its rows (``Offset.next_seq``); the snapshot's
batch is numbered when it commits, after them, and records its rows' number (``Batch.rows_seq``),
so every table that applied the pull's batches applies it too. The commit never moves the stream
back behind the position the pull reached; the transform's order by position makes the state the
same whichever lands first.

A re-snapshot (on request, or under ``when_needed`` once the stored position has left the oplog)
is the same copy, and so is the copy of collections that started being captured after the first
snapshot (``newly_captured``), for which streaming keeps its position.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections import deque
from collections.abc import Generator, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from itertools import chain

import pyarrow as pa
from pymongo import MongoClient

from mongo_cdc.capture.capture_modes import captured_collection_options, require_images
from mongo_cdc.capture.change_cursor import token_cluster_time
from mongo_cdc.capture.chunk_reads import ChunkReads
from mongo_cdc.capture.chunking import plan_chunks
from mongo_cdc.capture.field_filters import collection_field_rules
from mongo_cdc.capture.field_hash_marks import FieldHashMarks
from mongo_cdc.capture.offsets import Offset, OffsetKeeper
from mongo_cdc.capture.raw_rows import SourceInfo
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.snapshot_columns import SnapshotColumns
from mongo_cdc.capture.snapshot_filters import manifest_of
from mongo_cdc.capture.streaming import resume_position_lost
from mongo_cdc.capture.topology import owned_ranges
from mongo_cdc.config import SourceConfig
from mongo_cdc.id_ranges import loads
from mongo_cdc.lake import RAW_SCHEMA
from mongo_cdc.lake.batch_log import Batch
from mongo_cdc.lake.landing import SourceLake
from mongo_cdc.lake.snapshot_log import Chunk, SnapshotPlan
from mongo_cdc.namespace import Namespace

log = logging.getLogger(__name__)

# Rows per Arrow batch handed to delta-rs at most; a batch never spans two server batches, so the
# BSON behind it is at most one reply (16 MiB).
ROW_GROUP_ROWS = 50_000
PROGRESS_INTERVAL_S = 10.0
# How often a copier records the chunks it copied in the snapshot log (``copy_chunks``), besides at its end.
RECORD_COPIED_SECONDS = 30.0
# A chunk whose rows are at most SMALL_CHUNK_BYTES is written and committed by a pool of
# CHUNK_COMMIT_THREADS while its copier reads on (``_SmallChunkCommits``): a source of many small
# collections is as many chunks, each mostly its raw table's creation (~5 ms of delta-rs CPU), which
# one copier would otherwise wait for in turn. A copier holds at most CHUNK_COMMIT_THREADS of them,
# and the one it is reading, in memory.
SMALL_CHUNK_BYTES = 4 * 1024 * 1024
CHUNK_COMMIT_THREADS = 4


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


def captured_collections(client: MongoClient, config: SourceConfig) -> list[tuple[str, str]]:
    return sorted((db, collection) for db, collection, _ in captured_collection_options(client, config))


def newly_captured(client: MongoClient, config: SourceConfig, offset: Offset) -> tuple[str, ...]:
    """Collections snapshots copy that the replica set's stream did not capture when ``offset``
    recorded its capture filter (``captured``): ``collection.include.list`` or another filter now
    matches them. None recorded yet (an offset from before such records): none.

    A collection created later under the same filter is not one: the stream has all its events.
    """
    recorded = offset.snapshot.get("captured")
    if recorded is None:
        return ()
    before = config.with_capture_filter(recorded)
    return tuple(
        f"{db}.{collection}"
        for db, collection in captured_collections(client, config)
        if config.snapshots_collection(db, collection) and not before.captures_collection(db, collection)
    )


def record_capture_filter(keeper: OffsetKeeper, config: SourceConfig) -> None:
    """Record the capture filter the stream goes on with, when no snapshot was needed for it."""
    offset = keeper.load()
    if (
        offset is not None
        and offset.snapshot_complete
        and offset.snapshot.get("captured") != config.capture_filter
    ):
        keeper.commit(offset, snapshot={**offset.snapshot, "captured": config.capture_filter})


def skip_abandoned_snapshot(keeper: OffsetKeeper) -> None:
    """Before streaming without the offset's unfinished snapshot (``snapshot.mode`` changed to
    ``never``, say): commit its number as a batch at the stored position that names no table, so no
    stream batch gets that number and counts the rows its chunks left."""
    offset = keeper.load_checked()
    if offset is None or offset.resume_token is None:
        return
    planned = keeper.lake.last_planned_seq(keeper.rs)
    if planned <= offset.batch_seq:
        return
    log.warning("replica set %s: streaming without finishing snapshot %d; its copied chunks are dropped",
                keeper.rs, planned)  # fmt: skip
    batch = Batch(keeper.rs, planned, "position", offset.resume_token, offset.cluster_time,
                  open_transaction=offset.open_transaction)  # fmt: skip
    keeper.commit_batch(offset, batch, snapshot={**offset.snapshot, "status": "abandoned"})


class _Progress:
    """Chunks done / total, documents, docs/s and ETA of the chunks one task copies."""

    def __init__(self, name: str, chunks: Sequence[Chunk]) -> None:
        self.name = name
        self.total = len(chunks)
        self.expected = sum(chunk.expected for chunk in chunks)
        self.done = 0
        self.documents = 0
        self.started = time.monotonic()
        self._last_log = self.started
        self._lock = threading.Lock()

    def add(self, documents: int, chunk_done: bool = False) -> None:
        with self._lock:
            self.documents += documents
            self.done += chunk_done
            now = time.monotonic()
            if chunk_done or now - self._last_log >= PROGRESS_INTERVAL_S:
                self._last_log = now
                rate = self.documents / max(now - self.started, 1e-9)
                left = max(self.expected - self.documents, 0) if self.done < self.total else 0
                eta = dt.timedelta(seconds=round(left / rate)) if rate else "unknown"
                log.info(
                    "%s: %d/%d chunks done, %d documents copied, %.0f docs/s, ETA %s",
                    self.name, self.done, self.total, self.documents, rate, eta,
                )  # fmt: skip


def _copy_chunk(
    config: SourceConfig,
    source_lake: SourceLake,
    source: SourceInfo,
    chunk: Chunk,
    batches: Iterator[bytes],
    plan: SnapshotPlan,
    progress: _Progress,
    small: _SmallChunkCommits,
) -> int | None:
    """Copy one chunk into its raw table as one commit of the ``plan``'s batch: the snapshot's hot loop.
    Its documents; None when it is small (SMALL_CHUNK_BYTES), its rows handed to ``small`` to commit.

    Batches arrive as raw BSON (no per-document cursor objects) and become Arrow batches of at most
    ``ROW_GROUP_ROWS`` rows without decoding a document (``snapshot_columns.SnapshotColumns``).
    """
    db, collection = Namespace.parse(chunk.namespace)
    cluster_time = plan.cluster_time
    block = source.block(db, collection, cluster_time, (cluster_time >> 32) * 1000, snapshot=True)
    fields = collection_field_rules(config, db, collection)
    columns = SnapshotColumns(block, cluster_time, plan.seq, fields, max_rows=ROW_GROUP_ROWS)
    copied = 0

    def tables() -> Generator[pa.RecordBatch, None, None]:
        nonlocal copied
        for batch in batches:
            for rows in columns.record_batches(batch):
                copied += rows.num_rows
                progress.add(rows.num_rows)
                yield rows

    rows = tables()
    held: list[pa.RecordBatch] = []
    held_bytes = 0
    for batch in rows:
        held.append(batch)
        held_bytes += batch.nbytes
        if held_bytes > SMALL_CHUNK_BYTES:
            break
    else:  # the whole chunk is held: small
        if held:  # an empty chunk gets no commit: the snapshot log records it
            small.commit(chunk, pa.Table.from_batches(held, RAW_SCHEMA))
            return None
        return 0
    source_lake.write_chunk(
        source.rs, plan.seq, chunk, pa.RecordBatchReader.from_batches(RAW_SCHEMA, chain(held, rows))
    )
    return copied


class _SmallChunkCommits:
    """One copier's small chunks, each written and committed (``SourceLake.write_chunk``) by the shared
    ``pool`` while the copier reads on; a chunk is done once its commit is (``done``). A commit's
    failure is raised at the copier's next call; once ``failed`` is set (this copier or another
    failed), commits not started yet are not made, and their chunks are left for the next attempt."""

    def __init__(
        self, source_lake: SourceLake, plan: SnapshotPlan, pool: ThreadPoolExecutor, failed: threading.Event
    ) -> None:
        self.source_lake, self.plan, self.pool, self.failed = source_lake, plan, pool, failed
        self.pending: deque[tuple[Chunk, int, Future[bool]]] = deque()

    def commit(self, chunk: Chunk, rows: pa.Table) -> None:
        self.pending.append((chunk, rows.num_rows, self.pool.submit(self._commit, chunk, rows)))

    def _commit(self, chunk: Chunk, rows: pa.Table) -> bool:
        if self.failed.is_set():
            return False
        try:
            self.source_lake.write_chunk(self.plan.rs, self.plan.seq, chunk, rows)
        except BaseException:
            self.failed.set()  # the commits queued behind it are not made
            raise
        return True

    def done(self, wait: bool = False) -> dict[Chunk, int]:
        """The chunks committed since the last call and their documents, in order; waits while more
        than CHUNK_COMMIT_THREADS are pending (``wait``: until none is). Raises a commit's failure."""
        committed = {}
        while self.pending and (wait or len(self.pending) > CHUNK_COMMIT_THREADS or self._oldest_done()):
            chunk, documents, future = self.pending.popleft()
            if future.result():
                committed[chunk] = documents
        return committed

    def _oldest_done(self) -> bool:
        return self.pending[0][-1].done()


class SnapshotIncompleteError(RuntimeError):
    """Chunks of the snapshot are not copied yet: it cannot be committed."""


def start_snapshot(
    source: ReplicaSetCapture,
    cluster: MongoClient | None = None,
    shard_id: str | None = None,
    only: Sequence[str] = (),
    filters: Mapping[str, str] | None = None,
) -> SnapshotPlan:
    """Record the position, split the collections into chunks and record the plan; or, when the
    offset's running snapshot was asked for the same collections and can still be resumed (its plan
    is in the lake, its position in the oplog), return that one's plan.

    ``snapshot.include.collection.list`` narrows the copy to the collections it matches; a replica
    set that already streams then keeps its position, like a re-snapshot of some collections.

    For one shard of a cluster, ``cluster`` (config server or router) and ``shard_id`` restrict
    sharded collections to the chunk ranges the shard owns, so orphaned documents are not emitted.

    ``only`` (``<db>.<collection>`` names) re-snapshots just those collections of a replica set
    that already streams. Its resume position then stays where it is, so the other collections
    miss no event; for the copied ones the stream replays events older than the copy, which the
    state skips. Without a streaming position to keep, every captured collection is copied.

    ``filters`` (``snapshot_filters.filter_text`` by namespace) read those of ``only`` through a
    filter; without a streaming position to keep, none is (the copy must be complete). None: the
    trigger asked for nothing, so an unfinished snapshot resumes with the filters it recorded.
    """
    client, config, rs, keeper = source.client, source.config, source.rs, source.keeper
    require_images(client, config, rs)
    stored = keeper.load_checked() or keeper.next_offset()
    requested = tuple(sorted(only))
    asked = None if filters is None else {name: text for name, text in filters.items() if name in requested}
    resumed = _resumable(client, keeper, stored, requested, asked)
    if resumed is not None:
        return resumed
    streams = stored.snapshot_complete and stored.resume_token is not None and not stored.retired_at
    # With snapshot.include.collection.list the collections left out are only streamed: moving the
    # position to this copy would skip their events since the stored one, so it stays when it can.
    keeps_position = streams and (
        bool(only)
        or (bool(config.snapshot_include) and not resume_position_lost(client, stored.resume_token))
    )
    if only and not keeps_position:
        log.info("replica set %s has no streaming position to keep: snapshotting every collection", rs)
        requested = ()
    filters = {name: text for name, text in (asked or {}).items() if name in requested}
    # a shard that returns after being retired starts afresh, its batch numbers still increasing
    offset = replace(stored, retired_at="")
    token = current_position(client)
    cluster_time = token_cluster_time(token)
    options = {f"{db}.{coll}": opts for db, coll, opts in captured_collection_options(client, config)}
    if requested:
        collections = [tuple(Namespace.parse(name)) for name in requested]
    else:
        collections = [(db, coll) for db, coll in sorted(tuple(Namespace.parse(n)) for n in options)]
        collections = [(db, coll) for db, coll in collections if config.snapshots_collection(db, coll)]
    # Never a number an earlier, abandoned snapshot planned: its chunks' rows must not count.
    seq = max(offset.next_seq, keeper.lake.last_planned_seq(rs) + 1)
    # The manifest lets the transform drop the documents this copy no longer finds. A shard back
    # from retirement has none to drop: what it held before was all migrated to other shards, yet
    # still counts as its own (migrations emit no events). The running offset keeps the flag for a
    # retry of such a copy.
    back_from_retirement = bool(stored.retired_at) or stored.snapshot.get("back_from_retirement", False)
    # The capture filter the stream covers once this snapshot is committed: the current one, unless
    # collections it newly captures are left out of this copy (they are then copied by a later one).
    new = set(newly_captured(client, config, stored)) if requested else set()
    captured = config.capture_filter if new <= set(requested) else stored.snapshot.get("captured")
    snapshot_info = {
        "status": "running",
        "seq": seq,
        "cluster_time": cluster_time,
        "back_from_retirement": back_from_retirement,
        "captured": captured,
    }
    if requested:
        snapshot_info["collections"] = list(requested)
    offset = keeper.commit(offset, snapshot=snapshot_info)
    chunks: list[Chunk] = []
    marks = FieldHashMarks(keeper.lake, config)
    for db, coll in collections:
        marks.before_copy(f"{db}.{coll}", whole=f"{db}.{coll}" not in filters)
        owned = owned_ranges(cluster, shard_id, db, coll) if cluster is not None else None
        found = plan_chunks(client[db][coll], config.snapshot_chunk_size, owned, options.get(f"{db}.{coll}"))
        # several chunks, or other shards' copies of a sharded collection, commit to one table at once
        keeper.lake.prepare_raw_table(rs, seq, f"{db}.{coll}", concurrent=len(found) > 1 or owned is not None)
        chunks.extend(found)
    plan = SnapshotPlan(
        rs=rs,
        seq=seq,
        resume_token=token,
        cluster_time=cluster_time,
        requested=requested,
        keeps_position=keeps_position,
        back_from_retirement=back_from_retirement,
        started_at=dt.datetime.now(dt.timezone.utc).isoformat(),
        collections=tuple(f"{db}.{coll}" for db, coll in collections),
        chunks=tuple(chunks),
        filters=filters,
    )
    keeper.lake.record_plan(plan)
    log.info(
        "snapshot %d of %s: %d collections in %d chunks of up to %d documents, from position %s",
        seq, rs, len(collections), len(chunks), config.snapshot_chunk_size, token["_data"][:18],
    )  # fmt: skip
    return plan


def _resumable(
    client: MongoClient,
    keeper: OffsetKeeper,
    stored: Offset,
    requested: tuple[str, ...],
    filters: Mapping[str, str] | None,
) -> SnapshotPlan | None:
    """The offset's running snapshot, if it copies ``requested`` (with ``filters``, unless None)
    and can go on where it stopped."""
    if stored.snapshot.get("status") != "running":
        return None
    plan = keeper.lake.snapshot_plan(keeper.rs, stored.snapshot["seq"])
    if plan is None:  # it stopped before its plan was recorded
        return None
    if plan.requested != requested:
        log.info(
            "replica set %s: the unfinished snapshot %d copied %s, this one copies %s: starting anew",
            keeper.rs, plan.seq, list(plan.requested) or "everything", list(requested) or "everything",
        )  # fmt: skip
        return None
    if filters is not None and dict(plan.filters) != filters:
        log.info(
            "replica set %s: the unfinished snapshot %d read with filters %s, this one %s: starting anew",
            keeper.rs, plan.seq, dict(plan.filters) or "none", filters or "none",
        )  # fmt: skip
        return None
    if resume_position_lost(client, plan.resume_token):
        log.warning("replica set %s: the unfinished snapshot %d's position has left the oplog: starting anew",
                    keeper.rs, plan.seq)  # fmt: skip
        return None
    copied = keeper.lake.copied_chunks(keeper.rs, plan.seq)
    log.info("replica set %s: resuming snapshot %d, %d of its %d chunks already copied",
             keeper.rs, plan.seq, len(copied), len(plan.chunks))  # fmt: skip
    return plan


def copy_chunks(
    client: MongoClient,
    config: SourceConfig,
    source_lake: SourceLake,
    plan: SnapshotPlan,
    chunks: Sequence[Chunk] | None = None,
) -> dict[Chunk, int | None]:
    """Copy the chunks of ``plan`` (``chunks``: only these) not copied yet, ``snapshot.max.threads``
    at a time; the documents each one copied (None: landed by an attempt cut short before it
    recorded them). The first failure stops the copy; what committed before stays committed."""
    copied = source_lake.copied_chunks(plan.rs, plan.seq)
    todo = [
        chunk
        for chunk in (plan.chunks if chunks is None else chunks)
        if (chunk.namespace, chunk.index) not in copied
    ]
    name = f"snapshot {plan.seq} of {plan.rs}"
    log.info(
        "%s: copying %d chunks (%d of its %d chunks already copied)",
        name,
        len(todo),
        len(copied),
        len(plan.chunks),
    )
    progress = _Progress(name, todo)
    source = SourceInfo(config.topic_prefix, plan.rs)
    queries = {namespace: loads(text) for namespace, text in plan.filters.items()}
    pending = iter(todo)
    claiming = threading.Lock()
    failed = threading.Event()
    documents: dict[Chunk, int | None] = {}

    def claim(unrecorded: dict[Chunk, int | None]) -> Chunk | None:
        """The next chunk to read, none once a copy failed; those an earlier attempt committed go
        into ``unrecorded`` on the way."""
        while not failed.is_set():
            with claiming:
                chunk = next(pending, None)
            if chunk is None or not source_lake.chunk_landed(plan.rs, plan.seq, chunk):
                return chunk
            log.info("%s: chunk %s was committed by an earlier attempt", name, chunk.label)
            unrecorded[chunk] = documents[chunk] = None
            progress.add(0, chunk_done=True)
        return None

    def copier(commits: ThreadPoolExecutor) -> None:
        """Copy chunks in turn until none is left, claiming the next one early so it is read ahead;
        a small chunk is committed by ``commits`` while the next ones are read (``_SmallChunkCommits``).

        The chunks it copied go into the snapshot log in one commit when it is done (and every
        RECORD_COPIED_SECONDS on the way): a source of many small collections has as many chunks, and
        a commit each cost more than their copy. A chunk committed but not recorded yet (a copy cut
        short) is found by its raw table's app transaction at the next attempt (``claim``), not
        read again."""
        unrecorded: dict[Chunk, int | None] = {}
        small = _SmallChunkCommits(source_lake, plan, commits, failed)
        recorded_at = time.monotonic()

        def finished(chunks: dict[Chunk, int]) -> None:
            for chunk, copied in chunks.items():
                unrecorded[chunk] = documents[chunk] = copied
                progress.add(0, chunk_done=True)

        try:
            with ChunkReads(client, config, queries) as reads:
                chunk = claim(unrecorded)
                while chunk is not None:
                    following = claim(unrecorded)
                    log.info("%s: copying chunk %s, %s", name, chunk.label, chunk.describe())
                    batches = reads.batches(chunk, following)
                    copied = _copy_chunk(config, source_lake, source, chunk, batches, plan, progress, small)
                    if copied is not None:
                        finished({chunk: copied})
                    finished(small.done())
                    if time.monotonic() - recorded_at >= RECORD_COPIED_SECONDS:
                        source_lake.record_copied(plan.rs, plan.seq, unrecorded)
                        unrecorded, recorded_at = {}, time.monotonic()
                    chunk = following
            finished(small.done(wait=True))
            source_lake.record_copied(plan.rs, plan.seq, unrecorded)
        except BaseException:
            failed.set()
            raise

    copiers = max(min(config.snapshot_max_threads, len(todo)), 1)  # with nothing to do, one finds that out
    with (
        ThreadPoolExecutor(CHUNK_COMMIT_THREADS, thread_name_prefix="snapshot-commit") as commits,
        ThreadPoolExecutor(max_workers=copiers, thread_name_prefix="snapshot") as pool,
    ):
        futures = [pool.submit(copier, commits) for _ in range(copiers)]
    for future in futures:
        if future.exception() is not None:
            raise future.exception()  # type: ignore[misc]
    return {chunk: documents[chunk] for chunk in todo}


def commit_snapshot(keeper: OffsetKeeper, plan: SnapshotPlan) -> SnapshotResult:
    """Commit the snapshot's batch (its manifest) and move the offset, once every chunk is copied."""
    rs, seq = plan.rs, plan.seq
    copied = keeper.lake.copied_chunks(rs, seq)
    missing = [chunk for chunk in plan.chunks if (chunk.namespace, chunk.index) not in copied]
    if missing:
        named = ", ".join(chunk.label for chunk in missing[:5]) + (", …" if len(missing) > 5 else "")
        raise SnapshotIncompleteError(
            f"snapshot {seq} of replica set {rs}: {len(missing)} of its {len(plan.chunks)} chunks are not "
            f"copied yet ({named}); "
            "see the failed snapshot_copy tasks. Their retries, or the next run, copy only those chunks, "
            "then commit the snapshot."
        )
    result = SnapshotResult(seq=seq, cluster_time=plan.cluster_time)
    result.documents = {namespace: 0 for namespace in plan.collections}
    with_rows: set[str] = set()
    for (namespace, _), documents in copied.items():
        result.documents[namespace] += documents or 0
        if documents is None or documents:
            with_rows.add(namespace)
    result.seconds = (
        dt.datetime.now(dt.timezone.utc) - dt.datetime.fromisoformat(plan.started_at)
    ).total_seconds()
    offset = keeper.load_checked() or keeper.next_offset()
    if offset.snapshot.get("seq") == seq and offset.snapshot_complete:
        return result  # a retry of a commit that went through
    reconciled, id_ranges = manifest_of(plan.collections, plan.filters)
    # Batches streamed while the copy ran committed after it started: the snapshot's batch is numbered
    # after them, so every table that applied them still applies it; its rows keep the number
    # reserved at the start (``rows_seq``).
    batch_seq = max(offset.batch_seq + 1, seq)
    # A stream that went on beside the copy is already at or past its position: moving it back there
    # would land those events again.
    keeps_position = plan.keeps_position or (
        offset.cluster_time is not None and offset.cluster_time >= plan.cluster_time
    )
    batch = Batch(
        rs=rs,
        seq=batch_seq,
        kind="snapshot",
        resume_token=offset.resume_token if keeps_position else plan.resume_token,
        cluster_time=offset.cluster_time if keeps_position else plan.cluster_time,
        snapshot_cluster_time=plan.cluster_time,
        collections=None if plan.back_from_retirement else reconciled,
        snapshot_id_ranges=id_ranges,
        namespaces=tuple(namespace for namespace in plan.collections if namespace in with_rows),
        open_transaction=offset.open_transaction if keeps_position else None,
        rows_seq=None if batch_seq == seq else seq,
    )
    snapshot_info = {
        "status": "complete",
        "seq": seq,
        "cluster_time": plan.cluster_time,
        "documents": result.total,
        "completed_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "captured": offset.snapshot.get("captured"),
    }
    if plan.keeps_position:
        snapshot_info["collections"] = list(plan.collections)
    keeper.commit_batch(replace(offset, retired_at=""), batch, snapshot=snapshot_info)
    log.info(
        "snapshot %d of %s complete: %d documents in %d chunks, %.1fs since it started (%.0f docs/s)",
        seq, rs, result.total, len(plan.chunks), result.seconds, result.total / max(result.seconds, 1e-9),
    )  # fmt: skip
    return result


def run_snapshot(
    source: ReplicaSetCapture,
    cluster: MongoClient | None = None,
    shard_id: str | None = None,
    only: Sequence[str] = (),
    filters: Mapping[str, str] | None = None,
) -> SnapshotResult:
    """The whole snapshot in this process (``start_snapshot``, ``copy_chunks``, ``commit_snapshot``)."""
    plan = start_snapshot(source, cluster, shard_id, only, filters)
    copy_chunks(source.client, source.config, source.lake, plan)
    return commit_snapshot(source.keeper, plan)
