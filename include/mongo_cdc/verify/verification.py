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

**Cheap by ranges** (``comparison``): count and digest per ``_id`` range and cell, MongoDB read
once, only the documents of differing cells compared one by one.

**Repair** (``verify.on.drift``: ``repair``, ``fail``; not ``report``) re-reads the drifted documents
and lands them as one raw batch of the replica set at position ``V``, like a snapshot's reads:
``r`` rows for the documents MongoDB has, ``d`` rows for those it has not. The transform folds them
with the usual ordering, so an event after ``V`` still wins, and the changes table shows one row per
repaired document. The batch keeps the stored resume position (streaming goes on from it).

**Recovery after a lost oplog** (``recovery``, ``capture.oplog_recovery``): nothing is left out (the
state plus the events since is not MongoDB across the gap), the drift is always healed, each
document landing as the change its difference implies (``c``/``u``/``d``, ``oplog_recovery.heal_op``)
marked ``source.sequence`` ``recovery``, and the batch is of kind ``heal`` when every collection was
verified: that ends the recovery; otherwise the next run heals again.

**Sharded clusters:** each shard verifies the shard-key ranges it owns (``comparison.ShardScope``),
so a chunk migration is never drift and repairs land on the shard that owns the document.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from dataclasses import dataclass, field

from mongo_cdc import extjson
from mongo_cdc.capture.capture_modes import captured_collection_options
from mongo_cdc.capture.change_cursor import token_cluster_time
from mongo_cdc.capture.collection_kinds import VIEW_BATCH
from mongo_cdc.capture.field_filters import collection_field_rules
from mongo_cdc.capture.field_hash_marks import FieldHashMarks
from mongo_cdc.capture.offsets import Offset
from mongo_cdc.capture.oplog_recovery import HEAL_BATCH, RECOVERY_SEQUENCE, heal_op
from mongo_cdc.capture.raw_rows import RawRow, SourceInfo, now_ms, tombstone_of
from mongo_cdc.capture.raw_tables import keys_and_documents, raw_documents, raw_rows_table
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.snapshot import current_position
from mongo_cdc.capture.stream_filter import namespace_filter
from mongo_cdc.capture.time_series import captured_time_series
from mongo_cdc.lake.batch_log import Batch
from mongo_cdc.lake.verification_log import REPAIRED, REPORTED, SKIPPED, RangeReport
from mongo_cdc.namespace import Namespace
from mongo_cdc.transform.keys import document_key
from mongo_cdc.transform.raw_events import event_keys
from mongo_cdc.verify.comparison import HASHED_SHARD_KEY, CollectionCheck, ShardScope

log = logging.getLogger(__name__)

REPAIR = "repair"
FAIL = "fail"
REPORT = "report"
BATCH_KIND = "verify"
# _ids per query when drifted documents are read again
_REREAD_IDS = 1000
# how long the change stream may take to reach the verification's position
_STREAM_TIMEOUT_S = 120.0
# how long a getMore of that stream waits for events: its first reply stops at the resume token, so
# on a quiet replica set one wait always passed before the position was reached (200 ms took 0.2 s
# of every verification)
_STREAM_AWAIT_MS = 20


def changed_keys(capture: ReplicaSetCapture, token: dict, until: int) -> tuple[dict[str, set[str]], set[str]]:
    """The normalised keys of every captured document with an event from ``token`` up to cluster
    time ``until``, by namespace; and the namespaces dropped or renamed in that time."""
    changed: dict[str, set[str]] = {}
    gone: set[str] = set()
    pipeline = [namespace_filter(capture.config).stage]
    deadline = time.monotonic() + _STREAM_TIMEOUT_S
    # the client decodes dates as DatetimeMS (``topology``), which document_key takes
    with capture.client.watch(pipeline, resume_after=token, max_await_time_ms=_STREAM_AWAIT_MS) as stream:
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
            # ``until`` (a new stream's position) is one tick past the last write when it was
            # taken: every event before it has been shown once the token reaches the tick before.
            # Waiting for ``until`` itself waited for the next write: on a quiet replica set, its
            # no-op writer's, up to 10 s later
            if token_cluster_time(stream.resume_token) >= until - 1:
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
    must be empty once their drop is applied). Not the views nor the time-series collections: each
    view's read is a comparison (``view_capture``), each time-series collection has its reconcile."""
    config = capture.config
    known = set(options)
    # a time-series collection is compared by its own reconcile (capture.time_series), by time
    batched = {series.namespace for series in captured_time_series(capture.client, config)}
    for batch in batches:
        if batch.kind == VIEW_BATCH:
            continue
        for namespace in batch.namespaces:
            db, name = Namespace.parse(namespace)
            if (
                batch.rs == capture.rs
                and config.captures_database(db)
                and config.captures_collection(db, name)
            ):
                known.add(namespace)
    return sorted(known - batched)


def verify_replica_set(
    capture: ReplicaSetCapture, on_drift: str, shard: ShardScope | None = None, *, recovery: bool = False
) -> VerificationResult:
    """Verify every collection of the replica set (each on its own: one that fails leaves the others
    verified), land the repairs (``on_drift`` ``repair`` or ``fail``) and record the report. For a
    shard of a cluster (``shard``), its part of the collections (``ShardScope``). ``recovery``: heal
    the replica set after a lost oplog (the module doc), whatever ``on_drift`` says."""
    keeper, rs = capture.keeper, capture.rs
    on_drift = REPAIR if recovery else on_drift
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
    unhealed: set[str] = set()  # skipped for now: a recovery is not over until they are verified
    namespaces = verified_namespaces(capture, options, batches)
    # MongoDB's documents are hashed as configured now: compared with (and healed into) a state
    # hashed otherwise, every document would drift, and its repairs would mix two kinds of hashes
    FieldHashMarks(capture.lake, capture.config).check(namespaces)
    for namespace in namespaces:
        try:
            if shard is not None and shard.owned(namespace) is None:
                if not shard.holds_unsharded(Namespace.parse(namespace).db):
                    continue  # another shard's: its database's primary shard verifies it
            check = CollectionCheck(
                capture, namespace, options.get(namespace), batches, shard, heal=on_drift != REPORT
            )
            if check.skipped is None:
                check.compare()
                checks.append(check)
            else:
                reports.append(RangeReport(namespace, -1, 0, None, action=SKIPPED, note=check.skipped))
                if check.skipped != HASHED_SHARD_KEY:  # one never verified does not hold a recovery up
                    unhealed.add(namespace)
        except Exception as exc:  # one collection's failure leaves the others verified
            log.exception("%s: verification FAILED", namespace)
            result.failed[namespace] = f"{type(exc).__name__}: {exc}"
    position = current_position(capture.client)
    result.cluster_time = token_cluster_time(position)
    changed, gone = changed_keys(capture, offset.resume_token, result.cluster_time)
    action = REPORTED if on_drift == REPORT else REPAIRED
    repairs: dict[str, dict[str, object]] = {}
    for check in checks:
        db = Namespace.parse(check.namespace).db
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
            unhealed.add(check.namespace)
            continue
        # a routine verification leaves to the transform what the lake will apply; a recovery cannot
        left_out = set() if recovery else changed.get(check.namespace, set()) | check.pending_keys
        drifted = check.settle(left_out, action)
        if drifted:
            repairs[check.namespace] = drifted
        if healed is not None and check.reports:
            check.reports[0].note = healed
        reports.extend(check.reports)
        result.collections[check.namespace] = {
            **_collection_summary(check.reports),
            "healed_files": check.healed_files,
        }
    if recovery:
        healed = not result.failed and not unhealed
        in_state = {check.namespace: check.in_state for check in checks}
        if repairs or healed:  # a heal batch without rows still ends the recovery
            result.repair_batch_seq = land_repairs(
                capture,
                offset,
                repairs,
                result.cluster_time,
                in_state,
                HEAL_BATCH if healed else BATCH_KIND,
                RECOVERY_SEQUENCE,
            )
        if not healed:
            left = ", ".join(sorted(unhealed | set(result.failed)))
            log.warning("replica set %s: the recovery from a lost oplog is not over (not verified: %s); "
                        "the next run heals again", rs, left)  # fmt: skip
    elif repairs and on_drift != REPORT:
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
    capture: ReplicaSetCapture,
    offset: Offset,
    repairs: dict[str, dict[str, object]],
    cluster_time: int,
    recovered: dict[str, set[str]] | None = None,
    kind: str = BATCH_KIND,
    sequence: str | None = None,
) -> int:
    """Read the drifted documents again and land them as one batch (of ``kind``) of raw rows at
    ``cluster_time``: ``r`` with the document as MongoDB has it now, ``d`` where it has none. With
    ``recovered`` (per namespace, the drifted keys the state holds: a recovery's or a view's read),
    the change each difference implies instead (``oplog_recovery.heal_op``). ``sequence``: the
    rows' ``source.sequence``, which tells a reader where they came from. Returns the batch number."""
    keeper, config = capture.keeper, capture.config
    source = SourceInfo(config.topic_prefix, capture.rs)
    seq = offset.next_seq
    written = set(repairs)
    for namespace, drifted in sorted(repairs.items()):
        db, name = Namespace.parse(namespace)
        in_state = None if recovered is None else recovered.get(namespace, set())
        block = source.values(
            db, name, cluster_time, (cluster_time >> 32) * 1000, snapshot=True, sequence=sequence
        )
        fields = collection_field_rules(config, db, name)
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
                        op = "r" if in_state is None else heal_op(key in in_state, True)
                        rows.append(_repair_row(raw_key, op, document, block, cluster_time))
        for key, value in ids:
            if key in found or (in_state is not None and heal_op(key in in_state, False) is None):
                continue  # a recovery's: neither the state nor MongoDB has it now
            row = _repair_row(extjson.document_key(value), "d", None, block, cluster_time)
            rows.extend([row, tombstone_of(row)] if config.tombstones_on_delete else [row])
        if rows:
            keeper.lake.write_raw(capture.rs, seq, namespace, raw_rows_table(rows, seq))
        else:
            written.discard(namespace)
    batch = Batch(capture.rs, seq, kind, offset.resume_token, offset.cluster_time,
                  namespaces=tuple(sorted(written)), open_transaction=offset.open_transaction)  # fmt: skip
    keeper.commit_batch(offset, batch)
    return seq


def _repair_row(raw_key: str, op: str, document: bytes | None, block: tuple, cluster_time: int) -> RawRow:
    return RawRow(raw_key, op, now_ms(), None, document, None, block, cluster_time, "")
