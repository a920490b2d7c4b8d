"""One collection's comparison with the lake's state (``CollectionCheck``), the part of
``verification`` that reads both sides.

**Cheap by ranges.** The collection is cut into the snapshot's ``_id`` ranges (``chunking``), and
each range into cells by a hash of the ``_id``'s bytes; per cell, the count and the sums of a
128-bit hash of the document bytes (``digest``, in bulk) are computed on the state's rows (placed
in ranges by ``key_order``) and on the source's raw BSON batches, neither decoded. MongoDB is read
once: a range's batches are held while it is read (up to ``_HELD_BYTES``), and the documents of its
cells that differ are taken from them; only the state's rows of those cells are then read again
and compared document by document. So drift spread over a collection costs about its documents,
not a second read. Memory stays bounded however much differs: past ``_COMPARED_ROWS`` documents,
the remaining ranges are compared in groups, each read again.

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

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pymongo import MongoClient

from mongo_cdc import lake
from mongo_cdc.capture.chunk_reads import ChunkReads
from mongo_cdc.capture.chunking import plan_chunks
from mongo_cdc.capture.document_ids import document_id, document_keys
from mongo_cdc.capture.field_filters import collection_field_rules
from mongo_cdc.capture.raw_tables import keys_and_documents, raw_documents
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.topology import OwnedRanges, owned_ranges
from mongo_cdc.lake.batch_log import Batch, BatchWindow
from mongo_cdc.lake.errors import damaged_files, naming_damaged_files
from mongo_cdc.lake.snapshot_log import Chunk
from mongo_cdc.lake.storage import LakeLocation, table_if_exists
from mongo_cdc.lake.table_reads import read_rows, scan_rows
from mongo_cdc.lake.verification_log import RangeReport
from mongo_cdc.namespace import Namespace
from mongo_cdc.transform.raw_events import applied_batches, event_keys
from mongo_cdc.verify.digest import Digests, cells_per_range, document_hashes, id_cells
from mongo_cdc.verify.key_order import RangeFinder

log = logging.getLogger(__name__)

# documents held in memory at once (a few hundred bytes each) when cells are compared document by
# document: more are compared in groups, each a pass over the state and a read of their ranges
_COMPARED_ROWS = 500_000
# why a collection is never verified on a shard (not a passing reason: a recovery does not wait for it)
HASHED_SHARD_KEY = "its shard key is hashed: rows cannot be placed in a shard's ranges"
# a range's batches held while it is read, for the documents of its differing cells: beyond this, the
# range is read again for them
_HELD_BYTES = 64 << 20


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
        return owned_ranges(self.cluster, self.shard_id, *Namespace.parse(namespace))

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
        db, name = Namespace.parse(namespace)
        self.collection = capture.client[db][name]
        self.fields = collection_field_rules(capture.config, db, name)
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
            self.skipped = HASHED_SHARD_KEY
        self.chunks: list[Chunk] = []
        self.reports: list[RangeReport] = []
        self.diffs: dict[int, RangeDiff] = {}
        self.in_state: set[str] = set()  # the drifted keys the state holds (extra or different)
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
        # a pending snapshot deletes the state's documents of its replica set it did not read: none to
        # delete (no state, or a shard's first copy) is no reason to wait
        copied_by = {
            batch.rs
            for batch in pending
            if batch.manifest is not None and namespace in batch.manifest.collections
        }
        if self.state is not None and copied_by and self._holds_rows_of(copied_by):
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

    def _holds_rows_of(self, replica_sets: set[str]) -> bool:
        """Whether the state has rows whose last event came from one of ``replica_sets``."""
        assert self.state is not None
        wanted = pa.array(sorted(replica_sets))
        with naming_damaged_files(self.state_uri, self.capture.lake.options):
            return any(
                pc.any(pc.is_in(rows.column("__rs"), wanted)).as_py()
                for rows in scan_rows(self.state, ["__rs"])
            )

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

    def _state_rows(self) -> Iterator[tuple[pa.StringArray, pa.BinaryArray]]:
        """The state's rows a batch at a time: keys, documents."""
        if self.state is None:
            return
        with naming_damaged_files(self.state_uri, self.capture.lake.options):
            for rows in scan_rows(self.state, ["__key", "__doc_bson"]):
                yield rows.column("__key").combine_chunks(), rows.column("__doc_bson").combine_chunks()

    def compare(self) -> None:
        """Each range's documents bucketed into cells (``digest.id_cells``) and a digest per cell on
        both sides: the state's first, then MongoDB's a range at a time. The documents of a range's
        differing cells are taken from the batches just read (no second read of MongoDB) while they
        are few; then the differing cells are compared document by document."""
        count = len(self.chunks)
        cells = cells_per_range(count)
        state = Digests(count * cells)
        for keys, documents in self._state_rows():
            ranges_of = self.finder.indexes(keys, documents)  # -1: none of this shard's ranges
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
        wanted = np.zeros(len(self.chunks) * cells, bool)  # by range and cell
        for index in ranges:
            wanted[index * cells + differing[index]] = True
        in_any_range = wanted.reshape(-1, cells).any(axis=0)
        stored: dict[str, tuple[tuple[int, int], object, int]] = {}
        for keys, documents in self._state_rows():
            in_cells = id_cells(documents, cells)
            # only the rows whose cell differs in some range are placed in ranges: placing every row
            # cost as much as finding its cell
            maybe = np.flatnonzero(in_any_range[in_cells])
            if not len(maybe):
                continue
            picked = pa.array(maybe)
            documents, keys = documents.take(picked), keys.take(picked)
            ranges_of = self.finder.indexes(keys, documents)
            placed = ranges_of >= 0
            hit = placed & wanted[np.where(placed, ranges_of * cells + in_cells[maybe], 0)]
            _keep(stored, ranges_of, hit, documents, keys=keys)
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

    def settle(self, left_out: set[str], action: str) -> dict[str, object]:
        """Leave out the keys ``left_out`` (those the transform is to fix: ``verification`` says
        which); record the drift in the reports; the drifted keys' _ids."""
        drifted: dict[str, object] = {}
        for index, diff in self.diffs.items():
            report = self.reports[index]
            found = (("missing", diff.missing), ("extra", diff.extra), ("different", diff.different))
            for name, all_keys in found:
                keys = all_keys - left_out
                setattr(report, name, len(keys))
                report.example_keys.extend(sorted(keys)[: 10 - len(report.example_keys)])
                drifted.update((key, diff.ids[key]) for key in keys)
                if all_keys is not diff.missing:
                    self.in_state.update(keys)
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
