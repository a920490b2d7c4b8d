"""Verifying one replica set's collections against the lake's state, and healing what drifted.

**What is compared.** MongoDB's documents, read now, against the state table's ``__key`` and
``__doc_bson``, which stand as of the last batch the state applied. Every document that changed
in between, by an event the change stream shows, is left out: the state has not seen it yet, and
the transform will apply it. So the comparison needs no snapshot read at a past cluster time (which
mongod keeps only ``minSnapshotHistoryWindowInSeconds``, 300 s by default); a key is left out when

* a committed raw row past the state's applied batch holds it (landed, not transformed yet), or
* the change stream, from the replica set's committed position up to the verification's position
  ``V`` (taken after every read), shows an event for it: it changed while it was being read.

A document that differs and has neither is drift: a write the change stream never showed
(``fromMigrate`` writes, a restored backup, a filter that was wrong for a while) or lake damage.
Limits: a document that drifted *and* changed since the state's batch is not reported (the change
usually heals it: an insert or replace carries the whole document; an update without ``after``
does not); documents are compared by their bytes, so a state folded from update descriptions
(``capture.mode`` without full documents) may differ in field order and is then replaced.

**Cheap by ranges.** The collection is cut into the snapshot's ``_id`` ranges (``chunking``), and
each range into cells by a hash of the ``_id``'s bytes; per cell, the count and the sums of a
128-bit hash of the document bytes (``digest``, in bulk) are computed on the state's rows (placed
in ranges by ``key_order``) and on the source's raw BSON batches, neither decoded. MongoDB is read
once: a range's batches are held while it is read (up to ``_HELD_BYTES``), and the documents of its
cells that differ are taken from them; only the state's rows of those cells are then read again
and compared document by document. So drift spread over a collection costs about its documents,
not a second read. Memory stays bounded however much differs: past ``_COMPARED_ROWS`` documents,
the remaining ranges are compared in groups, each read again.

**Repair** (``verify.on.drift``: ``repair``, ``fail``; not ``report``) re-reads the drifted documents
and lands them as one raw batch of the replica set at position ``V``, like a snapshot's reads:
``r`` rows for the documents MongoDB has, ``d`` rows for those it has not. The transform folds them
with the usual ordering, so an event after ``V`` still wins, and the changes table shows one row per
repaired document. The batch keeps the stored resume position (streaming goes on from it).

**Sharded clusters: each shard over the ranges it owns.** The state is the union of the shards, and
chunk migrations (``fromMigrate`` writes, invisible to change streams) move documents between shards
without an event, so a state row's replica set (``__rs``) does not say which shard holds it now.
Each shard's task verifies the shard-key ranges ``config.chunks`` gives it (the ranges its snapshot
copies, orphans left out) against the state rows whose shard-key value falls in them, whichever
shard their last event came from; the unsharded collections are verified by their database's
primary shard. So a migrated document is compared where it now lives, and its repairs land on the
shard that owns it. A collection whose chunks change hands while it is verified is skipped (noted in
the report), so a migration never reports drift. Limits: state rows are placed by shard key after
decoding their document unless the key is ``_id``; hashed shard keys are not verified (MongoDB's
hash of a value is not computed here); events still unpulled on the shard a chunk left (not yet
landed) make a false report there, which the repair then overwrites with the current document.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pymongo import MongoClient

from mongo_cdc import extjson, lake
from mongo_cdc.capture.capture_modes import captured_collection_options
from mongo_cdc.capture.chunk_reads import ChunkReads
from mongo_cdc.capture.chunking import plan_chunks
from mongo_cdc.capture.events import (
    SourceInfo,
    document_id,
    document_keys,
    keys_and_documents,
    now_ms,
    raw_documents,
    rows_to_table,
    token_cluster_time,
    tombstone_of,
)
from mongo_cdc.capture.offsets import Offset
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.snapshot import current_position
from mongo_cdc.capture.stream_filter import namespace_filter
from mongo_cdc.capture.topology import OwnedRanges, owned_ranges
from mongo_cdc.lake.batch_log import Batch, BatchWindow
from mongo_cdc.lake.errors import damaged_files, naming_damaged_files
from mongo_cdc.lake.snapshot_log import Chunk
from mongo_cdc.lake.storage import LakeLocation, table_if_exists
from mongo_cdc.lake.table_reads import read_rows, scan_rows
from mongo_cdc.lake.verification_log import REPAIRED, REPORTED, SKIPPED, RangeReport
from mongo_cdc.transform.keys import document_key
from mongo_cdc.transform.raw_events import applied_batches, event_keys
from mongo_cdc.verify.digest import Digests, cells_per_range, document_hashes, id_cells
from mongo_cdc.verify.key_order import RangeFinder

log = logging.getLogger(__name__)

REPAIR = "repair"
FAIL = "fail"
REPORT = "report"
BATCH_KIND = "verify"
# _ids per query when drifted documents are read again
_REREAD_IDS = 1000
# documents held in memory at once (a few hundred bytes each) when cells are compared document by
# document: more are compared in groups, each a pass over the state and a read of their ranges
_COMPARED_ROWS = 500_000
# a range's batches held while it is read, for the documents of its differing cells: beyond this, the
# range is read again for them
_HELD_BYTES = 64 << 20
# how long the change stream may take to reach the verification's position
_STREAM_TIMEOUT_S = 120.0


@dataclass
class RangeDiff:
    """A range compared document by document: the drifted keys, and the _ids to read them again by."""

    missing: set[str] = field(default_factory=set)
    extra: set[str] = field(default_factory=set)
    different: set[str] = field(default_factory=set)
    ids: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class ShardScope:
    """The shard of a cluster a verification runs on: ``cluster`` is the config server's (or a
    router's) client. A shard verifies the shard-key ranges it owns of each sharded collection, and
    the unsharded collections of the databases it is the primary shard of."""

    cluster: MongoClient
    shard_id: str

    def owned(self, namespace: str) -> OwnedRanges | None:
        db, _, name = namespace.partition(".")
        return owned_ranges(self.cluster, self.shard_id, db, name)

    def holds_unsharded(self, db: str) -> bool:
        """Whether this shard is the primary shard of ``db`` (without a ``config.databases`` entry:
        the first shard by id), which holds its unsharded collections."""
        config = self.cluster["config"]
        entry = config["databases"].find_one({"_id": db}) or {}
        first = next(iter(config["shards"].find({}, {"_id": 1}).sort("_id", 1).limit(1)), {})
        return entry.get("primary", first.get("_id")) == self.shard_id


class CollectionCheck:
    """One collection's comparison: cell digests per range, then the differing cells document by document."""

    def __init__(
        self,
        capture: ReplicaSetCapture,
        namespace: str,
        options: dict | None,
        batches: list[Batch],
        shard: ShardScope | None = None,
        heal: bool = False,
    ):
        self.capture = capture
        self.namespace = namespace
        db, _, name = namespace.partition(".")
        self.collection = capture.client[db][name]
        self.fields = capture.config.field_filters.for_collection(db, name)
        source_lake = capture.lake
        self.state_uri = lake.table_uri(source_lake.location, "state", source_lake.prefix, db, name)
        self.state = table_if_exists(self.state_uri, source_lake.options)
        self.healed_files = self._drop_damaged_files() if heal and self.state is not None else []
        self.applied = 0
        self.pending_keys: set[str] = set()
        self.skipped = self._pending(batches)
        self.shard = shard
        self.owned = shard.owned(namespace) if shard is not None else None
        if self.owned is not None and any(direction == "hashed" for _, direction in self.owned.key):
            self.skipped = "its shard key is hashed: rows cannot be placed in a shard's ranges"
        self.chunks: list[Chunk] = []
        self.reports: list[RangeReport] = []
        self.diffs: dict[int, RangeDiff] = {}
        if self.skipped is None:
            size = capture.config.snapshot_chunk_size
            self.chunks = plan_chunks(self.collection, size, self.owned, options)
            self.finder = RangeFinder(self.chunks)

    def _drop_damaged_files(self) -> list[str]:
        """Take the state's missing and truncated data files out of its log (a truncated one moved
        aside first, to ``<file>.damaged``): their documents are then missing from the state, and the
        comparison lands them again from MongoDB. The files' URIs."""
        options = self.capture.lake.options
        damaged = damaged_files(self.state_uri, options)
        if not damaged:
            return []
        base = self.state_uri.rstrip("/")
        filesystem, root = LakeLocation(base, options).filesystem()
        for file in damaged:
            if file.problem != "missing":
                path = f"{root}/{file.uri[len(base) + 1 :]}"
                filesystem.move(path, f"{path}.damaged")
        assert self.state is not None
        self.state.repair(dry_run=False)
        self.state = table_if_exists(self.state_uri, options)
        listed = "; ".join(f"{file.uri} ({file.problem})" for file in damaged)
        log.warning(
            "%s: state data files taken out of the table's log, their documents to be read again from "
            "MongoDB: %s",
            self.namespace,
            listed,
        )
        return [file.uri for file in damaged]

    def _pending(self, batches: list[Batch]) -> str | None:
        """Why the collection cannot be verified now (None: it can); the keys of raw rows the state
        has not applied yet (``pending_keys``), of any replica set (a shard's documents may have
        come from another by a chunk migration), which the comparison leaves out."""
        namespace = self.namespace
        applied = applied_batches(self.state, "state", sorted({batch.rs for batch in batches}))
        self.applied = applied.get(self.capture.rs, 0)
        pending = [batch for batch in batches if batch.seq > applied.get(batch.rs, 0)]
        # a pending snapshot deletes the state's documents it did not read: no state, none to delete
        manifests = [batch.manifest for batch in pending if batch.manifest is not None]
        if self.state is not None and any(namespace in manifest.collections for manifest in manifests):
            return "a snapshot of it is not applied to the state yet"
        window = BatchWindow.of(pending, namespace, applied)
        raw = table_if_exists(self.capture.lake.raw_uri(namespace), self.capture.lake.options)
        if window.is_empty or raw is None:
            return None
        with naming_damaged_files(raw.table_uri, self.capture.lake.options):
            rows = read_rows(raw, ["key", "op"], window.where())
        if pc.any(pc.is_in(rows.column("op"), pa.array(sorted(lake.COLLECTION_OPERATIONS)))).as_py():
            return "a drop or rename of it is not applied to the state yet"
        self.pending_keys = set(event_keys(rows.column("key"))[0].to_pylist())
        return None

    def moved(self) -> bool:
        """Whether the shard's ranges of the collection changed since the check began (a chunk
        migration committed): its documents were then read from a shard that no longer owns them."""
        return self.shard is not None and self.shard.owned(self.namespace) != self.owned

    def _source(self, reads: ChunkReads, index: int) -> Iterator[pa.BinaryArray]:
        """The documents of range ``index`` as MongoDB has them, the field rules applied."""
        following = self.chunks[index + 1] if index + 1 < len(self.chunks) else None
        for batch in reads.batches(self.chunks[index], following):
            documents = raw_documents(batch)
            yield documents if self.fields is None else keys_and_documents(documents, self.fields)[1]

    def _lake(self) -> Iterator[tuple[np.ndarray, pa.StringArray, pa.BinaryArray]]:
        """The state's rows a batch at a time: each row's range (-1: none of this shard's), keys,
        documents."""
        if self.state is None:
            return
        with naming_damaged_files(self.state_uri, self.capture.lake.options):
            for rows in scan_rows(self.state, ["__key", "__doc_bson"]):
                keys = rows.column("__key").combine_chunks()
                documents = rows.column("__doc_bson").combine_chunks()
                yield self.finder.indexes(keys, documents), keys, documents

    def compare(self) -> None:
        """Each range's documents bucketed into cells (``digest.id_cells``) and a digest per cell on
        both sides: the state's first, then MongoDB's a range at a time. The documents of a range's
        differing cells are taken from the batches just read (no second read of MongoDB) while they
        are few; then the differing cells are compared document by document."""
        count = len(self.chunks)
        cells = cells_per_range(count)
        state = Digests(count * cells)
        for ranges_of, _, documents in self._lake():
            mine = np.flatnonzero(ranges_of >= 0)
            if len(mine) < len(documents):
                documents = documents.take(pa.array(mine))
            state.add(ranges_of[mine] * cells + id_cells(documents, cells), document_hashes(documents))
        self.reports = [
            RangeReport(self.namespace, index, count, chunk.describe(), None,
                        int(state.counts[index * cells : (index + 1) * cells].sum()))
            for index, chunk in enumerate(self.chunks)
        ]  # fmt: skip
        read: dict[str, tuple[tuple[int, int], object, int]] = {}  # MongoDB's side of differing cells
        differing: dict[int, np.ndarray] = {}  # the differing cells of each range
        reread: list[int] = []
        with ChunkReads(self.capture.client, self.capture.config) as reads:
            for index in range(count):
                source = Digests(cells)
                held: list[tuple[pa.BinaryArray, np.ndarray, np.ndarray]] | None = []
                held_bytes = 0
                for documents in self._source(reads, index):
                    in_cells, hashes = id_cells(documents, cells), document_hashes(documents)
                    source.add(in_cells, hashes)
                    if held is not None:
                        held.append((documents, in_cells, hashes))
                        held_bytes += documents.nbytes
                        held = held if held_bytes <= _HELD_BYTES else None
                self.reports[index].source_count = int(source.counts.sum())
                found = source.differing(state.part(index * cells, cells))
                if not found:
                    continue
                differing[index] = np.array(sorted(found))
                if held is None or len(read) >= _COMPARED_ROWS:
                    reread.append(index)
                    continue
                for documents, in_cells, hashes in held:
                    _keep(read, index, np.isin(in_cells, differing[index]), documents, hashes)
        kept = [index for index in differing if index not in reread]
        if kept:
            self._compare_documents(kept, differing, cells, read)
        # the others in groups whose state rows to compare stay under _COMPARED_ROWS
        group: list[int] = []
        rows = 0
        for index in reread:
            cells_rows = int(state.counts[index * cells + differing[index]].sum())
            if group and rows + cells_rows > _COMPARED_ROWS:
                self._compare_documents(group, differing, cells, self._read_again(group, differing, cells))
                group, rows = [], 0
            group.append(index)
            rows += cells_rows
        if group:
            self._compare_documents(group, differing, cells, self._read_again(group, differing, cells))

    def _read_again(
        self, ranges: list[int], differing: dict[int, np.ndarray], cells: int
    ) -> dict[str, tuple[tuple[int, int], object, int]]:
        """MongoDB's documents of the differing cells of ``ranges``, read again."""
        read: dict[str, tuple[tuple[int, int], object, int]] = {}
        with ChunkReads(self.capture.client, self.capture.config) as reads:
            for index in ranges:
                for documents in self._source(reads, index):
                    wanted = np.isin(id_cells(documents, cells), differing[index])
                    _keep(read, index, wanted, documents)
        return read

    def _compare_documents(
        self,
        ranges: list[int],
        differing: dict[int, np.ndarray],
        cells: int,
        read: dict[str, tuple[tuple[int, int], object, int]],
    ) -> None:
        """The state's rows of the differing cells of ``ranges`` against MongoDB's (``read``)."""
        wanted = np.concatenate([index * cells + differing[index] for index in ranges])
        stored: dict[str, tuple[tuple[int, int], object, int]] = {}
        for ranges_of, keys, documents in self._lake():
            mine = np.flatnonzero(np.isin(ranges_of, ranges))
            if not len(mine):
                continue
            picked = pa.array(mine)
            documents, keys = documents.take(picked), keys.take(picked)
            in_cells = ranges_of[mine] * cells + id_cells(documents, cells)
            _keep(stored, ranges_of[mine], np.isin(in_cells, wanted), documents, keys=keys)
        for index in ranges:
            self.diffs[index] = RangeDiff()
        for key, (found, value, index) in read.items():
            held = stored.pop(key, None)
            if held is not None and held[0] == found:
                continue
            diff = self.diffs[index]
            (diff.missing if held is None else diff.different).add(key)
            diff.ids[key] = value
        for key, (_, value, index) in stored.items():
            self.diffs[index].extra.add(key)
            self.diffs[index].ids[key] = value

    def settle(self, changed: set[str], action: str) -> dict[str, object]:
        """Leave out the keys that changed (``changed`` and the pending raw rows); record the drift
        in the reports; the drifted keys' _ids."""
        left_out = changed | self.pending_keys
        drifted: dict[str, object] = {}
        for index, diff in self.diffs.items():
            report = self.reports[index]
            found = (("missing", diff.missing), ("extra", diff.extra), ("different", diff.different))
            for name, all_keys in found:
                keys = all_keys - left_out
                setattr(report, name, len(keys))
                report.example_keys.extend(sorted(keys)[: 10 - len(report.example_keys)])
                drifted.update((key, diff.ids[key]) for key in keys)
            if report.drift:
                report.action = action
        return drifted


def _keep(
    kept: dict[str, tuple[tuple[int, int], object, int]],
    ranges: int | np.ndarray,
    wanted: np.ndarray,
    documents: pa.BinaryArray,
    hashes: np.ndarray | None = None,
    keys: pa.StringArray | None = None,
) -> None:
    """Add the ``wanted`` documents (a mask) to ``kept``: key -> (hash, _id, range). ``hashes`` and
    ``keys`` (normalised, the state's) where known, else made from the documents."""
    rows = np.flatnonzero(wanted)
    if not len(rows):
        return
    picked = pa.array(rows)
    documents = documents.take(picked)
    found = document_hashes(documents) if hashes is None else hashes[rows]
    keys = event_keys(document_keys(documents))[0] if keys is None else keys.take(picked)
    indexes = ranges[rows].tolist() if isinstance(ranges, np.ndarray) else [ranges] * len(rows)
    for key, digest, document, index in zip(
        keys.to_pylist(), found.tolist(), documents.to_pylist(), indexes, strict=True
    ):
        kept[key] = (tuple(digest), document_id(document), index)


def changed_keys(capture: ReplicaSetCapture, token: dict, until: int) -> tuple[dict[str, set[str]], set[str]]:
    """The normalised keys of every captured document with an event from ``token`` up to cluster
    time ``until``, by namespace; and the namespaces dropped or renamed in that time."""
    changed: dict[str, set[str]] = {}
    gone: set[str] = set()
    pipeline = [namespace_filter(capture.config).stage]
    deadline = time.monotonic() + _STREAM_TIMEOUT_S
    # the client decodes dates as DatetimeMS (``topology``), which document_key takes
    with capture.client.watch(pipeline, resume_after=token, max_await_time_ms=200) as stream:
        while True:
            change = stream.try_next()
            if change is not None:
                # Past the position, stop: on a busy collection the stream never runs dry. Events at
                # the position itself count (a transaction's events share one cluster time).
                if token_cluster_time(change["_id"]) > until:
                    return changed, gone
                ns = change.get("ns") or {}
                namespace = f"{ns.get('db')}.{ns.get('coll')}"
                if "documentKey" in change:
                    changed.setdefault(namespace, set()).add(document_key(change["documentKey"]["_id"]))
                elif change["operationType"] in ("drop", "rename", "dropDatabase", "invalidate"):
                    gone.add(namespace if ns.get("coll") else f"{ns.get('db')}.*")
                continue
            if token_cluster_time(stream.resume_token) >= until:
                return changed, gone
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"replica set {capture.rs}: the change stream did not reach the verification's "
                    f"position within {_STREAM_TIMEOUT_S:.0f} s"
                )


@dataclass
class VerificationResult:
    rs: str
    verification_id: str
    verified_at: str
    cluster_time: int | None = None
    repair_batch_seq: int | None = None
    collections: dict[str, dict] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    skipped: str | None = None

    @property
    def drift(self) -> int:
        return sum(
            found["missing"] + found["extra"] + found["different"] for found in self.collections.values()
        )

    def to_dict(self) -> dict:
        return {
            "rs": self.rs,
            "verification_id": self.verification_id,
            "verified_at": self.verified_at,
            "cluster_time": self.cluster_time,
            "repair_batch_seq": self.repair_batch_seq,
            "drift": self.drift,
            "collections": self.collections,
            "failed": self.failed,
            "skipped": self.skipped,
        }


def verified_namespaces(
    capture: ReplicaSetCapture, options: dict[str, dict], batches: list[Batch]
) -> list[str]:
    """The captured collections, and those the lake holds that are gone from MongoDB (their state
    must be empty once their drop is applied)."""
    config = capture.config
    known = set(options)
    for batch in batches:
        for namespace in batch.namespaces:
            db, _, name = namespace.partition(".")
            if (
                batch.rs == capture.rs
                and config.captures_database(db)
                and config.captures_collection(db, name)
            ):
                known.add(namespace)
    return sorted(known)


def verify_replica_set(
    capture: ReplicaSetCapture, on_drift: str, shard: ShardScope | None = None
) -> VerificationResult:
    """Verify every collection of the replica set (each on its own: one that fails leaves the others
    verified), land the repairs (``on_drift`` ``repair`` or ``fail``) and record the report. For a
    shard of a cluster (``shard``), its part of the collections (``ShardScope``)."""
    keeper, rs = capture.keeper, capture.rs
    now = dt.datetime.now(dt.timezone.utc)
    result = VerificationResult(rs, str(uuid.uuid4()), now.isoformat(timespec="seconds"))
    offset = keeper.load_checked()
    if offset is None or offset.resume_token is None or not offset.snapshot_complete:
        result.skipped = "the replica set has no complete snapshot and streaming position yet"
    elif capture.lake.last_planned_seq(rs) > offset.batch_seq:
        result.skipped = "a snapshot of the replica set is unfinished"
    if result.skipped is not None:
        log.info("replica set %s: not verified: %s", rs, result.skipped)
        return result
    batches = capture.lake.batches()
    options = {
        f"{db}.{name}": found
        for db, name, found in captured_collection_options(capture.client, capture.config)
    }
    checks: list[CollectionCheck] = []
    reports: list[RangeReport] = []
    for namespace in verified_namespaces(capture, options, batches):
        try:
            if shard is not None and shard.owned(namespace) is None:
                if not shard.holds_unsharded(namespace.partition(".")[0]):
                    continue  # another shard's: its database's primary shard verifies it
            check = CollectionCheck(
                capture, namespace, options.get(namespace), batches, shard, heal=on_drift != REPORT
            )
            if check.skipped is None:
                check.compare()
                checks.append(check)
            else:
                reports.append(RangeReport(namespace, -1, 0, None, action=SKIPPED, note=check.skipped))
        except Exception as exc:  # one collection's failure leaves the others verified
            log.exception("%s: verification FAILED", namespace)
            result.failed[namespace] = f"{type(exc).__name__}: {exc}"
    position = current_position(capture.client)
    result.cluster_time = token_cluster_time(position)
    changed, gone = changed_keys(capture, offset.resume_token, result.cluster_time)
    action = REPORTED if on_drift == REPORT else REPAIRED
    repairs: dict[str, dict[str, object]] = {}
    for check in checks:
        db = check.namespace.partition(".")[0]
        note = None
        if check.namespace in gone or f"{db}.*" in gone:
            note = "dropped or renamed while it was verified"
        elif check.moved():
            note = "a chunk of it moved between shards while it was verified"
        healed = None
        if check.healed_files:
            healed = f"damaged state files taken out of its log: {', '.join(check.healed_files)}"
        if note is not None:
            note = note if healed is None else f"{note}; {healed}"
            reports.append(RangeReport(check.namespace, -1, 0, None, action=SKIPPED, note=note))
            continue
        drifted = check.settle(changed.get(check.namespace, set()), action)
        if drifted:
            repairs[check.namespace] = drifted
        if healed is not None and check.reports:
            check.reports[0].note = healed
        reports.extend(check.reports)
        result.collections[check.namespace] = {
            **_collection_summary(check.reports),
            "healed_files": check.healed_files,
        }
    if repairs and on_drift != REPORT:
        result.repair_batch_seq = land_repairs(capture, offset, repairs, result.cluster_time)
    rows = [report.to_row(result.verification_id, rs, result.cluster_time, _applied(checks, report.namespace),
                          result.repair_batch_seq, now) for report in reports]  # fmt: skip
    if rows:
        capture.lake.record_verification(rows)
    _log_result(result)
    return result


def _applied(checks: list[CollectionCheck], namespace: str) -> int | None:
    return next((check.applied for check in checks if check.namespace == namespace), None)


def _collection_summary(reports: list[RangeReport]) -> dict:
    return {
        "ranges": len(reports),
        "source_count": sum(report.source_count or 0 for report in reports),
        "lake_count": sum(report.lake_count or 0 for report in reports),
        "missing": sum(report.missing for report in reports),
        "extra": sum(report.extra for report in reports),
        "different": sum(report.different for report in reports),
        "example_keys": [key for report in reports for key in report.example_keys][:10],
    }


def _log_result(result: VerificationResult) -> None:
    for namespace, found in sorted(result.collections.items()):
        drift = found["missing"] + found["extra"] + found["different"]
        line = "%s: %d documents in MongoDB, %d in the state, %d ranges: %d missing, %d extra, %d different%s"
        level = logging.WARNING if drift else logging.INFO
        log.log(level, line, namespace, found["source_count"], found["lake_count"], found["ranges"],
                found["missing"], found["extra"], found["different"],
                f" (e.g. {', '.join(found['example_keys'][:3])})" if drift else "")  # fmt: skip
    if result.repair_batch_seq is not None:
        log.warning("replica set %s: %d drifted documents repaired by batch %d (the transform applies it)",
                    result.rs, result.drift, result.repair_batch_seq)  # fmt: skip


def land_repairs(
    capture: ReplicaSetCapture, offset: Offset, repairs: dict[str, dict[str, object]], cluster_time: int
) -> int:
    """Read the drifted documents again and land them as one batch of raw rows at ``cluster_time``:
    ``r`` with the document as MongoDB has it now, ``d`` where it has none. Returns the batch number."""
    keeper, config = capture.keeper, capture.config
    source = SourceInfo(config.topic_prefix, capture.rs)
    seq = offset.batch_seq + 1
    for namespace, drifted in sorted(repairs.items()):
        db, _, name = namespace.partition(".")
        block = source.block(db, name, cluster_time, (cluster_time >> 32) * 1000, snapshot=True)
        fields = config.field_filters.for_collection(db, name)
        rows: list[dict] = []
        ids = list(drifted.items())
        found: set[str] = set()
        for start in range(0, len(ids), _REREAD_IDS):
            wanted = [value for _, value in ids[start : start + _REREAD_IDS]]
            for batch in capture.client[db][name].find_raw_batches({"_id": {"$in": wanted}}):
                raw_keys, documents = keys_and_documents(raw_documents(batch), fields)
                keys = event_keys(raw_keys)[0].to_pylist()
                for key, raw_key, document in zip(
                    keys, raw_keys.to_pylist(), documents.to_pylist(), strict=True
                ):
                    if key in drifted:
                        found.add(key)
                        rows.append(_repair_row(raw_key, "r", document, block, cluster_time))
        for key, value in ids:
            if key not in found:
                row = _repair_row(extjson.document_key(value), "d", None, block, cluster_time)
                rows.extend([row, tombstone_of(row)] if config.tombstones_on_delete else [row])
        keeper.lake.write_raw(capture.rs, seq, namespace, rows_to_table(rows, seq))
    batch = Batch(capture.rs, seq, BATCH_KIND, offset.resume_token, offset.cluster_time,
                  namespaces=tuple(sorted(repairs)), open_transaction=offset.open_transaction)  # fmt: skip
    keeper.commit_batch(offset, batch)
    return seq


def _repair_row(raw_key: str, op: str, document: bytes | None, block: dict, cluster_time: int) -> dict:
    return {"key": raw_key, "op": op, "ts_ms": now_ms(), "before": None, "after": document,
            "updateDescription": None, "source": block, "cluster_time": cluster_time,
            "event_order": "", "transaction": None}  # fmt: skip
