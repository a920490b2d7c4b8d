"""Change-stream micro-batches for one replica set, from its stored resume token up to "now".

A pull reads until the stream's position reaches the cluster time observed when the pull
started (so a scheduled run covers its whole data interval and a manual trigger lands every
write made before the click), landing at most ``max.batch.size`` events per micro-batch:
files first, then the offset (see ``offsets`` for the exactly-once protocol). When nothing
captured changed, the offset still advances to the post-batch resume token, so a quiet
collection never lets the stored token age out of the oplog.

Before reading, the pull checks how long its committed position still has in the oplog
(``oplog_window``). The stream's pipeline starts with a ``$match`` on the captured namespaces
(``stream_filter``), so uncaptured databases' events stay on the server; the client filters every
event it gets all the same. Progress lines come from ``pull_progress``.

Faults inside a pull follow Debezium's ``connect.*`` settings. A lost connection or a resumable
server error reopens the stream at the last landed batch (events read but not landed yet are
dropped and read again, so nothing is lost or duplicated) after a backoff of
``connect.backoff.initial.delay.ms`` doubling up to ``connect.backoff.max.delay.ms``; after
``connect.max.attempts`` failed reconnections in a row the pull fails and leaves the offset as it
is. A newly elected primary is followed the same way, without waiting. Both are counted in the
pull's result (Debezium's ``NumberOfDisconnects`` / ``NumberOfPrimaryElections``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import pyarrow as pa
from pymongo import MongoClient
from pymongo.errors import ConnectionFailure, CursorNotFound, OperationFailure, PyMongoError

from mongo_cdc.capture.capture_modes import require_images, watch_options
from mongo_cdc.capture.change_cursor import open_change_stream, token_cluster_time
from mongo_cdc.capture.collection_events import collection_row, land_renamed_copy, rename_namespaces
from mongo_cdc.capture.field_filters import collection_field_rules
from mongo_cdc.capture.field_hash_marks import FieldHashMarks
from mongo_cdc.capture.garbage_collection import CyclicCollection
from mongo_cdc.capture.heartbeats import Heartbeats
from mongo_cdc.capture.landing_thread import LandingThread
from mongo_cdc.capture.micro_batch import MicroBatch, PullResult
from mongo_cdc.capture.offsets import Offset, OffsetError, OffsetKeeper
from mongo_cdc.capture.oplog_window import describe as describe_oplog
from mongo_cdc.capture.oplog_window import guard as oplog_guard
from mongo_cdc.capture.oplog_window import measure as measure_oplog
from mongo_cdc.capture.oversized_events import (
    BSON_OBJECT_TOO_LARGE,
    OVERSIZED_MARKER,
    FragmentJoiner,
    check_split_supported,
    is_oversized_marker,
    too_large_error,
)
from mongo_cdc.capture.oversized_events import pipeline as oversize_pipeline
from mongo_cdc.capture.pull_progress import PullProgress
from mongo_cdc.capture.raw_rows import DATA_OPERATIONS, SourceInfo, raw_rows_of_change
from mongo_cdc.capture.raw_tables import raw_rows_table
from mongo_cdc.capture.read_ahead import ReadAhead
from mongo_cdc.capture.replica_set import ReplicaSetCapture
from mongo_cdc.capture.stream_filter import namespace_filter
from mongo_cdc.capture.stream_move import landed_through
from mongo_cdc.capture.transactions import TRANSACTION_SCHEMA, TransactionTracker
from mongo_cdc.config import SourceConfig
from mongo_cdc.config.oversize_mode_table import OVERSIZE_MODES
from mongo_cdc.lake import DROP, RENAME, RENAMED_COPY_ORDER, TRANSACTION_DIR, pack_cluster_time
from mongo_cdc.lake.batch_log import Batch

log = logging.getLogger(__name__)

POLL_INTERVAL_MS = 1000
# How often the DAG pulls, when the caller does not say: the oplog guard counts headroom in these.
DEFAULT_INTERVAL_S = 3600.0
CHANGE_STREAM_HISTORY_LOST = 286


class ResumeError(RuntimeError):
    """The stored position cannot be resumed from; the message says how to recover."""


class SourceUnreachableError(RuntimeError):
    """The change stream could not be reopened within ``connect.max.attempts``; the offset is unchanged."""


def last_applied(client: MongoClient) -> int:
    """Packed cluster time of the newest oplog entry: every write acknowledged so far is at or before it.

    (The resume token of a fresh stream points one tick past it, and an idle replica set only moves
    past that with its 10-second no-op writes, so it would make a pull wait for nothing.)
    """
    applied = client.admin.command("ping")["operationTime"]
    return pack_cluster_time(applied.time, applied.inc)


def _land(
    keeper: OffsetKeeper,
    offset: Offset,
    rs: str,
    batch: MicroBatch,
    token: dict,
    transaction_records: pa.Table | None,
    open_transaction: dict[str, Any] | None,
) -> Offset:
    """Land one micro-batch (a commit per raw table, plus its transaction records), then commit it with
    its resume token (``landing``)."""
    seq = offset.next_seq
    keeper.lake.write_raw_tables(
        rs, seq, {namespace: raw_rows_table(rows, seq) for namespace, rows in batch.rows.items()}
    )
    if transaction_records is not None:
        lake = keeper.lake
        lake.write(lake.source_uri(TRANSACTION_DIR), rs, seq, transaction_records, TRANSACTION_SCHEMA, "rs")
    return keeper.commit_batch(
        offset,
        Batch(
            rs=rs,
            seq=seq,
            kind="stream",
            resume_token=token,
            cluster_time=token_cluster_time(token),
            snapshot_cluster_time=batch.copy_position if batch.copied else None,
            collections=batch.copied or None,
            namespaces=tuple(sorted(batch.rows)),
            # a rename's copy: its reads sit after a snapshot's at the rename's cluster time
            snapshot_event_order=RENAMED_COPY_ORDER if batch.copied else "",
            open_transaction=open_transaction,
        ),
    )


def stream_options(config: SourceConfig, offset: Offset) -> dict[str, Any]:
    return {
        "resume_after": offset.resume_token,
        "max_await_time_ms": POLL_INTERVAL_MS,
        "batch_size": config.max_batch_size,
        # the namespace $match first: it drops uncaptured events before they are measured or sent
        "pipeline": [
            namespace_filter(config).stage,
            *oversize_pipeline(config.cursor_oversize_handling_mode, config.cursor_oversize_skip_threshold),
        ],
        **watch_options(config),
    }


def backoff_delay_ms(config: SourceConfig, attempt: int) -> int:
    """Wait before reconnection ``attempt`` (1-based): the initial delay, doubled each time, capped."""
    delay_ms = config.connect_backoff_initial_delay_ms * 2 ** (attempt - 1)
    return min(delay_ms, config.connect_backoff_max_delay_ms)


def _is_transient(exc: PyMongoError) -> bool:
    """Errors a reopened stream gets past: the ones pymongo's own change-stream resume treats so."""
    if isinstance(exc, ConnectionFailure | CursorNotFound):
        return True
    return isinstance(exc, OperationFailure) and exc.has_error_label("ResumableChangeStreamError")


def _address(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


class _ChangeReader:
    """One pull's progress, kept across reopened change streams."""

    def __init__(
        self, client: MongoClient, config: SourceConfig, rs: str, keeper: OffsetKeeper, offset: Offset
    ) -> None:
        self.client = client
        self.config = config
        self.rs = rs
        self.keeper = keeper
        # the last landed position: every (re)opened stream starts here
        self.offset = offset
        self.landing: LandingThread | None = None  # the open stream's (``read``)
        self.collector = CyclicCollection()  # across the streams this pull opens
        self.source = SourceInfo(config.topic_prefix, rs)
        self.result = PullResult(rs=rs)
        self.progress = PullProgress(self.result)
        self.transactions = TransactionTracker(
            config.provide_transaction_metadata, rs, offset.open_transaction
        )
        self.heartbeats = Heartbeats(config, rs, keeper.lake)
        self.hash_marks = FieldHashMarks(keeper.lake, config)
        self.target: int | None = None
        self.primary: tuple[str, int] | None = None
        self.failures = 0
        # set by an invalidate: the next stream starts after it (a stream cannot resume after one)
        self.start_after: dict | None = None
        # events at or before it are in the lake already: read again after a move back (stream_move)
        self.landed_through = landed_through(keeper.lake, rs)

    def read(self) -> bool:
        """Open the stream at the last landed position and land batches until caught up (True).

        Returns False as soon as another member became primary, so the caller reopens the stream
        on it.
        """
        if self.target is None:
            self.target = last_applied(self.client)
        batch = MicroBatch()
        # a reopened stream starts after a whole event: fragments read before are read again
        fragments = FragmentJoiner()
        self.transactions.rewind()
        options = stream_options(self.config, self.offset)
        if self.start_after is not None:
            del options["resume_after"]
            options["start_after"] = self.start_after
        with (
            open_change_stream(self.client, **options) as stream,
            ReadAhead(stream, self.config.max_batch_size, self.target) as reads,
            LandingThread(self._landed) as self.landing,
            self.collector,
        ):
            opened_with_primary = self.client.primary
            landed_at_target = False
            while True:
                events, idle_token = reads.next()
                self.failures = 0
                self.progress.read(events, self.offset)
                if self._primary_moved_since(opened_with_primary):
                    return False
                token = idle_token
                for change in events:
                    change = fragments.add(change)
                    if change is None:
                        continue
                    change_token = change["_id"]
                    if change["operationType"] == "invalidate":
                        log.warning("replica set %s: change stream invalidated; reopening after it", self.rs)
                        self._land_read(batch)
                        self.start_after = change_token
                        return False
                    if self.landed_through is not None and change_token["_data"] <= self.landed_through:
                        self.result.replayed_dropped += 1
                    elif change["operationType"] == RENAME:
                        self._land_read(batch)
                        batch = self._rename_batch(change)
                    else:
                        collect_change(change, self.config, self.source, batch, self.transactions)
                    batch.last_token = change_token
                    # strictly past the target: more events of one transaction share its cluster
                    # time (and an open transaction's END has to land with it)
                    caught_up = (
                        token_cluster_time(change_token) > self.target
                        and not self.transactions.in_transaction
                    )
                    if self._full(batch) or (caught_up and self._has_news(batch)):
                        self._land(batch, change_token)
                        batch = MicroBatch()
                    if caught_up:
                        token = change_token
                        break
                if token is None or fragments.pending:  # more to read, or the rest of a split event
                    if not fragments.pending and self._at_target(batch):
                        # Land what is read while the stream shows whether more is there (an empty
                        # getMore waits POLL_INTERVAL_MS): a batch of many collections' changes
                        # takes as long to land.
                        self._land(batch, batch.last_token)
                        batch = MicroBatch()
                        landed_at_target = True
                    continue
                # The stream has shown everything up to here, and a transaction shows whole: any
                # transaction still open is over.
                self.transactions.finish()
                if self._has_news(batch):
                    self._land(batch, token)
                    batch = MicroBatch()
                # An empty getMore means the server has nothing newer to show; reaching the target
                # position then proves every event up to it has been seen.
                if token_cluster_time(token) >= self.target:
                    # what is left are operations that are not captured, seen since the last batch
                    self.result.add_counts(batch)
                    self.landing.settle()
                    # after a batch landed at the target, the next pull resumes there: it re-reads
                    # no event, and this one commits no batch of no rows
                    if token != self.offset.resume_token and not landed_at_target:
                        # a batch with no rows: the lake records every position an offset holds
                        self.offset = self.keeper.commit_batch(
                            self.offset,
                            Batch(
                                rs=self.rs,
                                seq=self.offset.next_seq,
                                kind="position",
                                resume_token=token,
                                cluster_time=token_cluster_time(token),
                                open_transaction=self.transactions.state(),
                            ),
                        )
                    self.heartbeats.beat(self.offset)
                    return True

    def _full(self, batch: MicroBatch) -> bool:
        """``max.batch.size`` events, or documents of ``max.queue.size.in.bytes`` (0: no limit)."""
        limit = self.config.max_queue_size_in_bytes
        return batch.events >= self.config.max_batch_size or (limit > 0 and batch.document_bytes >= limit)

    def _at_target(self, batch: MicroBatch) -> bool:
        """Whether ``batch`` has news and reaches the position the pull reads up to, outside a
        transaction (an open transaction's END has to land with it)."""
        return (
            batch.last_token is not None
            and token_cluster_time(batch.last_token) >= self.target
            and not self.transactions.in_transaction
            and self._has_news(batch)
        )

    def _has_news(self, batch: MicroBatch) -> bool:
        """Whether there is anything to land: events, a rename's copy (its manifest), or transaction
        records (an END alone)."""
        return bool(batch.events or batch.copied or self.transactions.records)

    def _land(self, batch: MicroBatch, token: dict) -> None:
        """Land ``batch`` up to ``token`` on the landing thread, after the batch before it."""
        self.landing.settle()
        self.hash_marks.check(batch.rows)  # before anything of the batch lands
        records = self.transactions.batch_table(self.offset.next_seq)
        open_transaction = self.transactions.state()
        self.transactions.landed()
        self.landing.start(
            partial(_land, self.keeper, self.offset, self.rs, batch, token, records, open_transaction)
        )
        self.collector.landed()
        self.start_after = None
        self.result.batches += 1
        self.result.add_counts(batch)

    def _landed(self, offset: Offset) -> None:
        """A batch landed (``LandingThread.settle``, on the pull's thread): streams reopen at it."""
        self.offset = offset
        self.heartbeats.beat(offset)

    def _land_read(self, batch: MicroBatch) -> None:
        """Land the events read so far, so a collection event can take a batch of its own."""
        if self._has_news(batch):
            self._land(batch, batch.last_token)
        else:
            self.result.add_counts(batch)

    def _rename_batch(self, change: dict) -> MicroBatch:
        """The rename row and, when the new name is captured, its copy: landed with the next events."""
        batch = MicroBatch()
        old, new = rename_namespaces(change, self.config)
        if old is not None:
            batch.add(old, RENAME, [collection_row(change, self.source)])
        if new is not None:
            self.landing.settle()  # the copy's batches come after the events read before the rename
            self.hash_marks.check([new])
            self.offset, reads, landed = land_renamed_copy(
                self.client, self.config, self.keeper, self.source, change, self.offset
            )
            log.info("replica set %s: %s renamed to %s; copied its %d documents", self.rs,
                     f"{change['ns']['db']}.{change['ns']['coll']}", new, landed + len(reads))  # fmt: skip
            batch.copied, batch.copy_position = (new,), token_cluster_time(change["_id"])
            batch.events_by_op[new]["r"] += landed
            if reads:
                batch.add(new, "r", reads, events=len(reads))
        return batch

    def _primary_moved_since(self, opened_with_primary: tuple[str, int] | None) -> bool:
        """Count an election when the primary changed; True when it is not the stream's primary any more.

        A stream can outlive an election (pymongo resumes it once by itself, and a stepped-down
        primary keeps serving open cursors), so the client's view of the primary is what tells.
        """
        primary = self.client.primary
        if primary is None:  # no primary right now (mid-election, or not a replica-set connection)
            return False
        if self.primary is not None and primary != self.primary:
            self.result.primary_elections += 1
            log.warning(
                "replica set %s: %s is the new primary (was %s)",
                self.rs, _address(primary), _address(self.primary),
            )  # fmt: skip
        self.primary = primary
        return primary != opened_with_primary

    def back_off(self, exc: PyMongoError, sleep: Callable[[float], None]) -> None:
        """Count a failure and wait before reconnecting; give up after connect.max.attempts reconnections."""
        self.failures += 1
        if self.failures == 1:
            self.result.disconnects += 1
        # failure n (the first one lost the stream) is followed by reconnection attempt n
        attempt = self.failures
        if attempt > self.config.connect_max_attempts:
            servers = self.client.topology_description.server_descriptions()
            hosts = ", ".join(sorted(_address(address) for address in servers))
            # One line naming the cause (a server selection error goes on with a whole topology
            # description); the full error stays chained to this one.
            error = str(exc).partition("\n")[0].partition(", Timeout: ")[0][:200]
            raise SourceUnreachableError(
                f"replica set {self.rs}: could not reopen the change stream on {hosts} in "
                f"{self.config.connect_max_attempts} reconnection attempts (connect.max.attempts); last "
                f"error {type(exc).__name__}: {error}. Offset '{self.keeper.key}' is unchanged: the "
                f"next run resumes after batch {self.offset.batch_seq}."
            ) from exc
        delay_ms = backoff_delay_ms(self.config, attempt)
        log.warning(
            "replica set %s: %s: %s; reconnecting in %d ms from batch %d (attempt %d of %d)",
            self.rs, type(exc).__name__, exc, delay_ms, self.offset.batch_seq,
            attempt, self.config.connect_max_attempts,
        )  # fmt: skip
        sleep(delay_ms / 1000)


def pull_changes(
    source: ReplicaSetCapture,
    sleep: Callable[[float], None] = time.sleep,
    interval_s: float = DEFAULT_INTERVAL_S,
) -> PullResult:
    """Stream one replica set from its committed position until it has caught up with now.

    ``sleep`` waits out the reconnection backoff (tests pass their own). ``interval_s`` is how often
    pulls run (the DAG's schedule interval): the oplog guard warns when the committed position
    would leave the oplog within ``oplog.headroom.warn.intervals`` of them.
    """
    client, config, rs, keeper = source.client, source.config, source.rs, source.keeper
    offset = keeper.load_checked()
    if offset is not None:
        offset = _beside_running_copy(client, keeper, offset)
    if offset is None or offset.resume_token is None:
        raise OffsetError(
            f"offset '{keeper.key}' has no resume position yet; the snapshot step must run first "
            "(check snapshot.mode)"
        )
    if OVERSIZE_MODES[config.cursor_oversize_handling_mode].splits:
        check_split_supported(client, rs)
    require_images(client, config, rs)
    window = oplog_guard(client, config, rs, token_cluster_time(offset.resume_token), interval_s, keeper.key)
    for pattern in namespace_filter(config).client_only:
        log.warning(
            "replica set %s: %s cannot be matched on the server exactly; every namespace it could "
            "concern is sent to the pull and filtered there",
            rs, pattern,
        )  # fmt: skip
    reader = _ChangeReader(client, config, rs, keeper, offset)
    while True:
        try:
            if reader.read():
                break
        except PyMongoError as exc:
            if isinstance(exc, OperationFailure) and exc.code == BSON_OBJECT_TOO_LARGE:
                raise too_large_error(rs, keeper.key, reader.offset.batch_seq) from exc
            if isinstance(exc, OperationFailure) and exc.code == CHANGE_STREAM_HISTORY_LOST:
                raise ResumeError(
                    f"replica set {rs}: the stored resume position ({keeper.key}) is no longer in the oplog, "
                    "so changes since then cannot be streamed. Re-snapshot it: trigger the DAG with the "
                    'params {"resnapshot": true} (add "shards": ["<its shard id>"] to copy only this '
                    "shard); the state tables are reconciled. With snapshot.mode when_needed, runs "
                    "heal it by themselves, reading again only the documents that differ."
                ) from None
            if not _is_transient(exc):
                raise
            reader.back_off(exc, sleep)
    result = reader.result
    result.batch_seq = reader.offset.batch_seq
    result.cluster_time = reader.offset.cluster_time or 0
    reader.progress.done(reader.offset)
    if window is not None:  # what the next pull resumes from: the position this one committed
        after = measure_oplog(client, rs, reader.offset.cluster_time or window.position)
        log.info("replica set %s after the pull: %s", rs, describe_oplog(after))
        result.oplog = after.to_dict()
    return result


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


def _beside_running_copy(client: MongoClient, keeper: OffsetKeeper, offset: Offset) -> Offset:
    """Where a pull beside the offset's running snapshot starts: its stored position while it has one
    in the oplog (events the copy also holds are folded by position, and the changes table keeps
    them). A stream with no position yet (a first snapshot), or one that left the oplog (a whole
    re-snapshot under ``when_needed``), starts at the copy's position, which its commit would move it
    to, unless the copy keeps the stored position (then there is none to start from)."""
    if offset.snapshot.get("status") != "running":
        return offset
    if offset.resume_token is not None and not resume_position_lost(client, offset.resume_token):
        return offset
    plan = keeper.lake.snapshot_plan(keeper.rs, offset.snapshot["seq"])
    if plan is None or plan.keeps_position:
        return offset
    log.info("replica set %s: streaming beside snapshot %d from its position", keeper.rs, plan.seq)
    return replace(
        offset, resume_token=plan.resume_token, cluster_time=plan.cluster_time, open_transaction=None
    )


def collect_change(
    change: dict,
    config: SourceConfig,
    source: SourceInfo,
    batch: MicroBatch,
    transactions: TransactionTracker,
) -> None:
    transactions.observe(change)
    if is_oversized_marker(change):
        _skip_oversized(change, config, batch)
        return
    operation = change["operationType"]
    op = DATA_OPERATIONS.get(operation)
    if operation == DROP:
        if config.captures_collection(change["ns"]["db"], change["ns"]["coll"]):
            batch.add(f"{change['ns']['db']}.{change['ns']['coll']}", DROP, [collection_row(change, source)])
        return
    if op is None:
        namespace = change.get("ns", {})
        if config.captures_database(namespace.get("db", "")):
            batch.ignored_operations[operation] += 1
            log.warning("change stream event %s on %s is not captured yet", operation, namespace)
        return
    db, collection = change["ns"]["db"], change["ns"]["coll"]
    if op in config.skipped_operations or not config.captures_collection(db, collection):
        return
    fields = collection_field_rules(config, db, collection)
    transaction = transactions.annotate(change)
    rows = raw_rows_of_change(change, source, config.tombstones_on_delete, fields, transaction)
    batch.add(f"{db}.{collection}", op, rows)


def _skip_oversized(marker: dict, config: SourceConfig, batch: MicroBatch) -> None:
    db, collection = marker["ns"]["db"], marker["ns"].get("coll", "")
    if not config.captures_collection(db, collection):
        return
    key = marker.get("documentKey", {}).get("_id")
    log.warning(
        "skipped a %s event on %s.%s (document %s, cluster time %s): %d bytes is over the limit "
        "(cursor.oversize.handling.mode skip)",
        marker["operationType"], db, collection, key, marker["clusterTime"], marker[OVERSIZED_MARKER],
    )  # fmt: skip
    batch.oversized_skipped[f"{db}.{collection}"] += 1
