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

**Cheap by ranges.** The collection is cut into the snapshot's ``_id`` ranges (``chunking``); per
range, the count and the sum of a 128-bit hash of (normalised key, document bytes) are computed on
the source's raw BSON batches and on the state's rows (placed in ranges by ``key_order``), neither
decoded. Only ranges whose digests differ are read again, document by document.

**Repair** (``verify.on.drift``: ``repair``, ``fail``; not ``report``) re-reads the drifted documents
and lands them as one raw batch of the replica set at position ``V``, like a snapshot's reads:
``r`` rows for the documents MongoDB has, ``d`` rows for those it has not. The transform folds them
with the usual ordering, so an event after ``V`` still wins, and the changes table shows one row per
repaired document. The batch keeps the stored resume position (streaming goes on from it).

Sharded clusters are not verified yet: a shard's state rows are the documents whose last event came
from it, which chunk migrations (invisible to change streams) move between shards.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from hashlib import blake2b as _blake2b

import bson
import pyarrow as pa
import pyarrow.compute as pc

from mongo_cdc import extjson, lake
from mongo_cdc.capture.capture_modes import captured_collection_options
from mongo_cdc.capture.chunk_reads import ChunkReads
from mongo_cdc.capture.chunking import plan_chunks
from mongo_cdc.capture.events import (
    RawRow,
    SourceInfo,
    keys_and_documents,
    now_ms,
    raw_documents,
    raw_rows_table,
    token_cluster_time,
    tombstone_of,
)
from mongo_cdc.capture.offsets import Offset
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.snapshot import current_position
from mongo_cdc.capture.stream_filter import namespace_filter
from mongo_cdc.extjson import DECODE_OPTIONS
from mongo_cdc.lake.batch_log import Batch, BatchWindow
from mongo_cdc.lake.errors import naming_damaged_files
from mongo_cdc.lake.snapshot_log import Chunk
from mongo_cdc.lake.storage import table_if_exists
from mongo_cdc.lake.table_reads import read_rows, scan_rows
from mongo_cdc.lake.verification_log import REPAIRED, REPORTED, SKIPPED, RangeReport
from mongo_cdc.transform.keys import document_key
from mongo_cdc.transform.raw_events import applied_batches, event_keys
from mongo_cdc.verify.key_order import RangeFinder

log = logging.getLogger(__name__)

REPAIR = "repair"
FAIL = "fail"
REPORT = "report"
BATCH_KIND = "verify"
# _ids per query when drifted documents are read again
_REREAD_IDS = 1000
# how long the change stream may take to reach the verification's position
_STREAM_TIMEOUT_S = 120.0


def document_hash(key: str, document: bytes) -> int:
    """A 128-bit hash of one document's normalised key and bytes: summed, it is the range's digest."""
    return int.from_bytes(_blake2b(key.encode() + b"\x00" + document, digest_size=16).digest(), "little")


@dataclass
class RangeDigest:
    """The documents of one ``_id`` range: how many, and the sum of their hashes (any order; a
    Python int, never reduced: the sum of a billion 128-bit hashes is 158 bits)."""

    count: int = 0
    total: int = 0

    def add(self, key: str, document: bytes) -> None:
        self.count += 1
        self.total += document_hash(key, document)


@dataclass
class RangeDiff:
    """A range compared document by document: the drifted keys, and the _ids to read them again by."""

    missing: set[str] = field(default_factory=set)
    extra: set[str] = field(default_factory=set)
    different: set[str] = field(default_factory=set)
    ids: dict[str, object] = field(default_factory=dict)


class CollectionCheck:
    """One collection's comparison: range digests, then the differing ranges document by document."""

    def __init__(
        self, capture: ReplicaSetCapture, namespace: str, options: dict | None, batches: list[Batch]
    ):
        self.capture = capture
        self.namespace = namespace
        db, _, name = namespace.partition(".")
        self.collection = capture.client[db][name]
        self.fields = capture.config.field_filters.for_collection(db, name)
        source_lake = capture.lake
        self.state_uri = lake.table_uri(source_lake.location, "state", source_lake.prefix, db, name)
        self.state = table_if_exists(self.state_uri, source_lake.options)
        rs = capture.rs
        self.applied = applied_batches(self.state, "state", [rs]).get(rs, 0)
        self.pending_keys: set[str] = set()
        self.skipped = self._pending(batches)
        self.chunks: list[Chunk] = []
        self.reports: list[RangeReport] = []
        self.diffs: dict[int, RangeDiff] = {}
        if self.skipped is None:
            self.chunks = plan_chunks(self.collection, capture.config.snapshot_chunk_size, None, options)
            self.finder = RangeFinder(self.chunks)

    def _pending(self, batches: list[Batch]) -> str | None:
        """Why the collection cannot be verified now (None: it can); the keys of raw rows the state
        has not applied yet (``pending_keys``), which the comparison leaves out."""
        rs, namespace = self.capture.rs, self.namespace
        own = [batch for batch in batches if batch.rs == rs and batch.seq > self.applied]
        # a pending snapshot deletes the state's documents it did not read: no state, none to delete
        manifests = [batch.manifest for batch in own if batch.manifest is not None]
        if self.state is not None and any(namespace in manifest.collections for manifest in manifests):
            return "a snapshot of it is not applied to the state yet"
        window = BatchWindow.of(own, namespace, {rs: self.applied})
        raw = table_if_exists(self.capture.lake.raw_uri(namespace), self.capture.lake.options)
        if window.is_empty or raw is None:
            return None
        with naming_damaged_files(raw.table_uri, self.capture.lake.options):
            rows = read_rows(raw, ["key", "op"], window.where())
        if pc.any(pc.is_in(rows.column("op"), pa.array(sorted(lake.COLLECTION_OPERATIONS)))).as_py():
            return "a drop or rename of it is not applied to the state yet"
        self.pending_keys = set(event_keys(rows.column("key"))[0].to_pylist())
        return None

    def _source(self, reads: ChunkReads, index: int) -> Iterator[tuple[str, bytes]]:
        following = self.chunks[index + 1] if index + 1 < len(self.chunks) else None
        for batch in reads.batches(self.chunks[index], following):
            raw_keys, documents = keys_and_documents(raw_documents(batch), self.fields)
            yield from zip(event_keys(raw_keys)[0].to_pylist(), documents.to_pylist(), strict=True)

    def _lake(self) -> Iterator[tuple[str, bytes]]:
        if self.state is None:
            return
        with naming_damaged_files(self.state_uri, self.capture.lake.options):
            for rows in scan_rows(self.state, ["__key", "__doc_bson"]):
                yield from zip(
                    rows.column("__key").to_pylist(), rows.column("__doc_bson").to_pylist(), strict=True
                )

    def compare(self) -> None:
        """Digests per range on both sides; the ranges that differ, document by document."""
        count = len(self.chunks)
        source = [RangeDigest() for _ in range(count)]
        with ChunkReads(self.capture.client, self.capture.config) as reads:
            for index in range(count):
                for key, document in self._source(reads, index):
                    source[index].add(key, document)
        state = [RangeDigest() for _ in range(count)]
        for key, document in self._lake():
            state[self.finder.index(key)].add(key, document)
        self.reports = [
            RangeReport(
                self.namespace, index, count, chunk.describe(), source[index].count, state[index].count
            )
            for index, chunk in enumerate(self.chunks)
        ]
        differing = {index for index in range(count) if source[index] != state[index]}
        if differing:
            self._compare_documents(differing)

    def _compare_documents(self, ranges: set[int]) -> None:
        """Read the ``ranges`` again on both sides and tell their documents apart."""
        stored: dict[str, tuple[int, bytes]] = {}
        for index in ranges:
            self.reports[index].lake_count = 0
        for key, document in self._lake():
            index = self.finder.index(key)
            if index in ranges:
                stored[key] = (document_hash(key, document), document)
                self.reports[index].lake_count += 1
        with ChunkReads(self.capture.client, self.capture.config) as reads:
            for index in sorted(ranges):
                diff = self.diffs[index] = RangeDiff()
                seen = 0
                for key, document in self._source(reads, index):
                    seen += 1
                    found = stored.pop(key, None)
                    if found is not None and found[0] == document_hash(key, document):
                        continue
                    (diff.missing if found is None else diff.different).add(key)
                    diff.ids[key] = _document_id(document)
                self.reports[index].source_count = seen
        for key, (_, document) in stored.items():
            diff = self.diffs[self.finder.index(key)]
            diff.extra.add(key)
            diff.ids[key] = _document_id(document)

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


def _document_id(document: bytes) -> object:
    return bson.decode(document, DECODE_OPTIONS)["_id"]


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


def verify_replica_set(capture: ReplicaSetCapture, on_drift: str) -> VerificationResult:
    """Verify every collection of the replica set (each on its own: one that fails leaves the others
    verified), land the repairs (``on_drift`` ``repair`` or ``fail``) and record the report."""
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
            check = CollectionCheck(capture, namespace, options.get(namespace), batches)
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
        if check.namespace in gone or f"{db}.*" in gone:
            reports.append(RangeReport(check.namespace, -1, 0, None, action=SKIPPED,
                                       note="dropped or renamed while it was verified"))  # fmt: skip
            continue
        drifted = check.settle(changed.get(check.namespace, set()), action)
        if drifted:
            repairs[check.namespace] = drifted
        reports.extend(check.reports)
        result.collections[check.namespace] = _collection_summary(check.reports)
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
        block = source.values(db, name, cluster_time, (cluster_time >> 32) * 1000, snapshot=True)
        fields = config.field_filters.for_collection(db, name)
        rows: list[RawRow] = []
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
        keeper.lake.write_raw(capture.rs, seq, namespace, raw_rows_table(rows, seq))
    batch = Batch(capture.rs, seq, BATCH_KIND, offset.resume_token, offset.cluster_time,
                  namespaces=tuple(sorted(repairs)), open_transaction=offset.open_transaction)  # fmt: skip
    keeper.commit_batch(offset, batch)
    return seq


def _repair_row(raw_key: str, op: str, document: bytes | None, block: tuple, cluster_time: int) -> RawRow:
    return RawRow(raw_key, op, now_ms(), None, document, None, block, cluster_time, "")
