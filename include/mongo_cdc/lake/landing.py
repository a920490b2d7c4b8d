"""Exactly-once landing of raw batches into Delta tables: the lake owns what is committed.

A replica set's batch ``seq`` lands in two steps:

1. Each raw table the batch touches gets one Delta commit holding the batch's rows for it, with
   the app transaction ``(app_id(rs), seq)``. A table that already holds rows of this batch (an
   earlier landing of it was cut short) has them replaced in the same commit, so a batch read
   again from the same position never doubles rows.
2. The batch log (``raw/<prefix>/_batches``) gets the batch's row, with the same app transaction:
   its replica set, number, kind, the resume position after it and, for a snapshot, the manifest
   (the collections it copied completely, as of ``snapshot_cluster_time``). This commit is the
   batch's commit: the transform applies only batches in the log, and a retry finds a batch in the
   log already committed.

The offset Variable is written after both and is only a cache of the log's last row for the
replica set: ``offsets.reconcile_with_lake`` heals it from the log or refuses it.

A snapshot batch lands in chunks (``SnapshotPlan``), each on its own, before the batch log's row
commits the whole snapshot:

1. When the snapshot starts, its plan (position, settings, every chunk's key range) is one commit
   of the snapshot log (``raw/<prefix>/_snapshots``) with the app transaction
   ``(<app id>/snapshot-plan, seq)``. A retry finds it there and resumes the same snapshot.
2. Each chunk's rows are one commit of its raw table with the app transaction
   ``(<app id>/chunk-<n>, seq)``: a chunk found committed is never read again, and its rows are
   never doubled. Then the snapshot log gets the chunk's ``copied`` row (which also records an
   empty chunk).
3. Once every chunk is copied, the batch log's row commits the snapshot (its manifest) as above.

A snapshot's number is never used again, even if it never got to step 3 (``last_planned_seq``:
a new snapshot is numbered after it, and a stream resuming without one first commits that number
as a batch that names no table), so rows of an abandoned snapshot never count.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import DeltaError
from deltalake.transaction import create_table_with_add_actions

from mongo_cdc import lake
from mongo_cdc.lake.batch_log import BATCH_LOG_SCHEMA, Batch, BatchWindow, last_batches
from mongo_cdc.lake.file_rewrites import normalize_last_commit
from mongo_cdc.lake.file_statistics import indexed_columns, table_indexed_columns
from mongo_cdc.lake.raw_files import write_files
from mongo_cdc.lake.snapshot_log import CHUNK, COPIED, SNAPSHOT, SNAPSHOT_LOG_SCHEMA, Chunk, SnapshotPlan
from mongo_cdc.lake.storage import LakeLocation, table_if_exists
from mongo_cdc.lake.table_reads import Where, read_rows
from mongo_cdc.lake.verification_log import VERIFICATION_LOG_SCHEMA
from mongo_cdc.namespace import Namespace

log = logging.getLogger(__name__)

# delta-rs retries a commit that lost a race with another writer (shards land concurrently)
COMMIT_RETRIES = 20


# How many raw tables one batch commits to at once (``write_raw_tables``).
RAW_COMMIT_THREADS = 8
# How many tables' logs are read at once (``tables``): each read is mostly a wait on the lake's storage.
TABLE_READ_THREADS = 8


class SourceLake:
    """One source's raw tables (one ``topic.prefix`` in one lake) and its batch log."""

    def __init__(self, location: LakeLocation, prefix: str) -> None:
        self.location = location
        self.prefix = prefix
        self.options = dict(location.storage_options)
        self._tables: dict[str, DeltaTable] = {}
        # (table uri, app id) -> the last batch this object committed to that table with that app
        # transaction (``_landed_here``)
        self._own_commits: dict[tuple[str, str], int] = {}
        # the batch log's version and its batches as ``batches`` last read them: a task's steps
        # (the pull, the views' and the time-series reads) each ask for the whole log
        self._batches_read: tuple[int, tuple[Batch, ...]] | None = None

    def app_id(self, rs: str) -> str:
        return f"mongo-cdc/{self.prefix}/{rs}"

    def raw_uri(self, namespace: str) -> str:
        return lake.table_uri(self.location, "raw", self.prefix, *Namespace.parse(namespace))

    def source_uri(self, name: str) -> str:
        return lake.source_table_uri(self.location, self.prefix, name)

    def tables(
        self, namespaces: Iterable[str], zones: Sequence[str]
    ) -> dict[tuple[str, str], DeltaTable | None]:
        """The latest version of each collection's table in each of ``zones`` (None: none yet), by
        (namespace, zone), TABLE_READ_THREADS at a time: a source of many collections has as many
        table logs to read."""
        uris = {
            (namespace, zone): lake.table_uri(self.location, zone, self.prefix, *Namespace.parse(namespace))
            for namespace in namespaces
            for zone in zones
        }
        with ThreadPoolExecutor(TABLE_READ_THREADS, thread_name_prefix="table-reads") as pool:
            found = pool.map(lambda uri: table_if_exists(uri, self.options), uris.values())
            return dict(zip(uris, found, strict=True))

    def _table(self, uri: str) -> DeltaTable | None:
        table = self._tables.get(uri)
        if table is None:
            table = table_if_exists(uri, self.options)
            if table is not None:
                self._tables[uri] = table
        else:
            table.update_incremental()
        return table

    def _landed_before(self, uri: str, app_id: str, seq: int) -> bool:
        """Whether this object committed a batch before ``seq`` to the table at ``uri`` with ``app_id``
        itself: a replica set has one writer, so batch ``seq`` cannot be there yet, and its app
        transaction needs no look-up (as costly as a tenth of a micro-batch's commit)."""
        landed = self._own_commits.get((uri, app_id))
        return landed is not None and landed < seq

    def write(
        self,
        uri: str,
        rs: str,
        seq: int,
        data: pa.Table | pa.RecordBatchReader,
        schema: pa.Schema = lake.RAW_SCHEMA,
        rs_column: str = "source['rs']",
    ) -> None:
        """One commit of batch ``seq``'s rows into the table at ``uri`` (replacing an earlier try's).

        ``rs_column`` is the SQL expression of a row's replica set (raw tables keep it in ``source``).
        """
        app_id = self.app_id(rs)
        transaction = CommitProperties(
            app_transactions=[Transaction(app_id, seq)], max_commit_retries=COMMIT_RETRIES
        )
        table = self._table(uri)
        if table is not None and not self._landed_before(uri, app_id, seq):
            landed = table.transaction_version(app_id)
            if landed is not None and landed >= seq:
                # rows of this batch from a landing that was cut short: replaced, never doubled
                log.info(
                    "replacing rows of batch %d of %s in %s (an earlier landing was cut short)", seq, rs, uri
                )
                write_deltalake(
                    table,
                    data,
                    mode="overwrite",
                    predicate=f"{rs_column} = '{_sql_string(rs)}' AND batch_seq >= {seq}",
                    commit_properties=transaction,
                )
                normalize_last_commit(table, self.location)  # the files it rewrote hold view types
                self._own_commits[(uri, app_id)] = seq
                return
        self._append(uri, table, data, schema, transaction)
        self._own_commits[(uri, app_id)] = seq

    def _append(
        self,
        uri: str,
        table: DeltaTable | None,
        data: pa.Table | pa.RecordBatchReader,
        schema: pa.Schema,
        transaction: CommitProperties,
    ) -> None:
        """Append ``data`` as new files (``lake_files``) in one commit, creating the table if need be."""
        partition_by = [lake.HOUR_COLUMN] if lake.HOUR_COLUMN in schema.names else []
        indexed = indexed_columns(schema, {}, partition_by) if table is None else table_indexed_columns(table)
        actions = write_files(self.location, uri, data, partition_by[0] if partition_by else None, indexed)
        if table is None:
            try:
                create_table_with_add_actions(
                    uri,
                    DeltaSchema.from_arrow(schema),
                    actions,
                    mode="error",
                    partition_by=partition_by,
                    storage_options=self.options,
                    commit_properties=transaction,
                )
                return
            except DeltaError:
                table = table_if_exists(uri, self.options)
                if table is None:
                    raise
                # another writer (a shard landing the same collection) created it first
                self._tables[uri] = table
        table.create_write_transaction(actions, "append", schema, partition_by, commit_properties=transaction)

    def write_raw(self, rs: str, seq: int, namespace: str, data: pa.Table | pa.RecordBatchReader) -> None:
        self.write(self.raw_uri(namespace), rs, seq, data)

    def write_raw_tables(self, rs: str, seq: int, tables: Mapping[str, pa.Table]) -> None:
        """Batch ``seq``'s rows of each namespace (``write_raw``), the tables' commits side by side: a
        batch of changes to many collections commits to as many tables, and delta-rs spends much of
        each commit waiting on storage."""
        if len(tables) < 2:
            for namespace, data in tables.items():
                self.write_raw(rs, seq, namespace, data)
            return
        with ThreadPoolExecutor(
            min(len(tables), RAW_COMMIT_THREADS), thread_name_prefix="raw-commit"
        ) as pool:
            for done in [pool.submit(self.write_raw, rs, seq, *item) for item in tables.items()]:
                done.result()

    def write_history(self, rs: str, namespace: str, hour: str, data: pa.Table) -> None:
        """Replace the history rows (``lake.HISTORY_SEQ``) of one replica set and hour of a raw table."""
        uri = self.raw_uri(namespace)
        table = self._table(uri)
        if table is None:
            write_deltalake(
                uri, data, partition_by=[lake.HOUR_COLUMN], mode="append", storage_options=self.options
            )
            return
        predicate = (
            f"source['rs'] = '{_sql_string(rs)}' AND batch_seq = {lake.HISTORY_SEQ} "
            f"AND {lake.HOUR_COLUMN} = '{hour}'"
        )
        write_deltalake(
            table,
            data,
            mode="overwrite",
            predicate=predicate,
            commit_properties=CommitProperties(max_commit_retries=COMMIT_RETRIES),
        )

    # -- the batch log -----------------------------------------------------------------------------

    def commit(self, batch: Batch) -> None:
        """Record ``batch`` in the log: from now on it is committed (idempotent)."""
        uri = self.source_uri(lake.BATCH_LOG)
        app_id = self.app_id(batch.rs)
        # as this object's last commit left it (write_deltalake keeps the table current): another
        # writer's commits since are the commit's to reconcile (appends never conflict)
        table = self._tables.get(uri) if self._landed_before(uri, app_id, batch.seq) else None
        if table is None:
            table = self._table(uri)
            if table is not None and (table.transaction_version(app_id) or -1) >= batch.seq:
                return  # a retry of a batch the log has already
        row = pa.Table.from_pylist([batch.to_row()], schema=BATCH_LOG_SCHEMA)
        properties = CommitProperties(
            app_transactions=[Transaction(app_id, batch.seq)],
            max_commit_retries=COMMIT_RETRIES,
        )
        write_deltalake(
            table if table is not None else uri,
            row,
            mode="append",
            # a log landed before snapshot_event_order, renamed_copy, snapshot_id_ranges or time_windows
            # gains the column (null in its old rows)
            schema_mode="merge",
            storage_options=None if table is not None else self.options,
            commit_properties=properties,
        )
        self._own_commits[(uri, app_id)] = batch.seq

    def batches(self) -> list[Batch]:
        """Every committed batch of every replica set, in (rs, seq) order."""
        table = self._table(self.source_uri(lake.BATCH_LOG))
        if table is None:
            return []
        version = table.version()
        if self._batches_read is None or self._batches_read[0] != version:
            rows = read_rows(table).sort_by([("rs", "ascending"), ("seq", "ascending")])
            self._batches_read = (version, tuple(Batch.from_row(row) for row in rows.to_pylist()))
        return list(self._batches_read[1])

    def last_batch(self, rs: str) -> Batch | None:
        """The replica set's last committed batch (the one its app transaction names)."""
        table = self._table(self.source_uri(lake.BATCH_LOG))
        if table is None:
            return None
        seq = table.transaction_version(self.app_id(rs))
        if seq is None:
            return None
        rows = read_rows(table, where=Where.equal(rs=rs, seq=seq)).to_pylist()
        if not rows:
            raise RuntimeError(
                f"the batch log {self.source_uri(lake.BATCH_LOG)} names batch {seq} of {rs} as committed "
                "but holds no row for it: the log was edited or damaged; restore it from a backup"
            )
        return Batch.from_row(rows[-1])

    def committed(self) -> dict[str, int]:
        """The last committed batch of each replica set."""
        return {rs: batch.seq for rs, batch in last_batches(self.batches()).items()}

    def committed_raw(self, namespace: str, columns: list[str] | None = None) -> pa.Table:
        """A collection's raw rows of committed batches (and backfilled history), in no set order."""
        table = self._table(self.raw_uri(namespace))
        if table is None:
            return lake.RAW_SCHEMA.empty_table().select(columns or lake.RAW_SCHEMA.names)
        window = BatchWindow.of(self.batches(), namespace, include_history=True)
        return read_rows(table, columns, window.where())

    def namespaces(self) -> list[str]:
        """Every ``<db>.<collection>`` some batch wrote raw rows to, sorted."""
        return sorted({namespace for batch in self.batches() for namespace in batch.namespaces})

    # -- chunked snapshots (the snapshot log) ------------------------------------------------------
    # Written by concurrent threads and tasks: each call loads the table afresh instead of sharing
    # a cached DeltaTable between threads.

    def _plan_app_id(self, rs: str) -> str:
        return f"{self.app_id(rs)}/snapshot-plan"

    def _chunk_app_id(self, rs: str, chunk: Chunk) -> str:
        # per chunk number, not per snapshot: the ids a table keeps stay as few as its largest plan
        return f"{self.app_id(rs)}/chunk-{chunk.index}"

    def last_planned_seq(self, rs: str) -> int:
        """The newest snapshot batch number ``rs`` planned (0: none), committed or not."""
        table = table_if_exists(self.source_uri(lake.SNAPSHOT_LOG), self.options)
        return (table.transaction_version(self._plan_app_id(rs)) or 0) if table is not None else 0

    def record_plan(self, plan: SnapshotPlan) -> None:
        """Record a snapshot's plan before any chunk is read (idempotent: one plan per batch)."""
        uri = self.source_uri(lake.SNAPSHOT_LOG)
        if self.last_planned_seq(plan.rs) >= plan.seq:
            return
        write_deltalake(
            uri,
            pa.Table.from_pylist(plan.to_rows(), schema=SNAPSHOT_LOG_SCHEMA),
            mode="append",
            storage_options=self.options,
            commit_properties=CommitProperties(
                app_transactions=[Transaction(self._plan_app_id(plan.rs), plan.seq)],
                max_commit_retries=COMMIT_RETRIES,
            ),
        )

    def _snapshot_rows(self, rs: str, seq: int, *kinds: str) -> list[dict]:
        table = table_if_exists(self.source_uri(lake.SNAPSHOT_LOG), self.options)
        if table is None:
            return []
        rows = read_rows(table, where=Where.equal(rs=rs, seq=seq))
        return rows.filter(pc.field("kind").isin(kinds)).to_pylist()

    def snapshot_plan(self, rs: str, seq: int) -> SnapshotPlan | None:
        """Snapshot ``seq``'s plan, or None if ``rs`` never recorded one of that number."""
        rows = self._snapshot_rows(rs, seq, SNAPSHOT, CHUNK)
        header = next((row for row in rows if row["kind"] == SNAPSHOT), None)
        if header is None:
            return None
        return SnapshotPlan.from_rows(header, [row for row in rows if row["kind"] == CHUNK])

    def copied_chunks(self, rs: str, seq: int) -> dict[tuple[str, int], int | None]:
        """(namespace, chunk) -> documents of every chunk of snapshot ``seq`` already copied (None:
        landed by an attempt that stopped before counting them)."""
        return {
            (row["namespace"], row["chunk"]): row["documents"] for row in self._snapshot_rows(rs, seq, COPIED)
        }

    def prepare_raw_table(self, rs: str, seq: int, namespace: str, concurrent: bool) -> None:
        """Get a raw table ready for snapshot ``seq``'s chunks, before the first one is read.

        Rows an earlier, cut-short landing of a batch numbered ``seq`` or later left there (app
        transaction at or past ``seq``) are deleted: chunks only append. ``concurrent``: several
        chunks will commit at once, so a missing table is created now (two first commits would
        both try to create it).
        """
        uri = self.raw_uri(namespace)
        table = table_if_exists(uri, self.options)
        if table is None and concurrent:
            self._create_raw_table(uri)
        elif table is not None and (table.transaction_version(self.app_id(rs)) or 0) >= seq:
            log.info("deleting rows of uncommitted batches >= %d of %s from %s", seq, rs, uri)
            table.delete(
                f"source['rs'] = '{_sql_string(rs)}' AND batch_seq >= {seq}",
                commit_properties=CommitProperties(max_commit_retries=COMMIT_RETRIES),
            )
            normalize_last_commit(table, self.location)  # the files it rewrote hold view types

    def raw_table_properties(self, namespace: str) -> dict[str, str] | None:
        """The table properties of a collection's raw table as committed now; None: no table yet.

        The table is kept for the writes that follow (``_table``), so asking before a landing
        costs no extra read of its log."""
        table = self._table(self.raw_uri(namespace))
        return None if table is None else dict(table.metadata().configuration)

    def set_raw_table_properties(self, namespace: str, properties: Mapping[str, str]) -> None:
        """Set table properties of a collection's raw table, creating the table if it has none yet."""
        uri = self.raw_uri(namespace)
        table = self._table(uri)
        if table is None:
            table = self._create_raw_table(uri, properties)
            if table is None:
                return
            # another writer created it first: set the properties on it as on any table
        table.alter.set_table_properties(dict(properties), raise_if_not_exists=False)

    def _create_raw_table(self, uri: str, properties: Mapping[str, str] | None = None) -> DeltaTable | None:
        """Create an empty raw table at ``uri`` with ``properties``: None once created, or the table
        another writer (a shard's snapshot, a concurrent run) created first."""
        try:
            DeltaTable.create(
                uri,
                lake.RAW_SCHEMA,
                partition_by=[lake.HOUR_COLUMN],
                mode="error",
                configuration=dict(properties or {}),
                raise_if_key_not_exists=False,
                storage_options=self.options,
            )
            return None
        except Exception:
            table = table_if_exists(uri, self.options)
            if table is None:
                raise
            return table

    def chunk_landed(self, rs: str, seq: int, chunk: Chunk) -> bool:
        """Whether ``chunk``'s rows are committed in its raw table (its app transaction is there)."""
        table = table_if_exists(self.raw_uri(chunk.namespace), self.options)
        return table is not None and (table.transaction_version(self._chunk_app_id(rs, chunk)) or 0) >= seq

    def write_chunk(self, rs: str, seq: int, chunk: Chunk, data: pa.Table | pa.RecordBatchReader) -> None:
        """One commit of ``chunk``'s rows into its raw table, with the chunk's app transaction."""
        uri = self.raw_uri(chunk.namespace)
        # not app_id(rs) too: concurrent commits naming one app id conflict
        transaction = CommitProperties(
            app_transactions=[Transaction(self._chunk_app_id(rs, chunk), seq)],
            max_commit_retries=COMMIT_RETRIES,
        )
        self._append(uri, self._table(uri), data, lake.RAW_SCHEMA, transaction)

    def record_copied(self, rs: str, seq: int, copied: Mapping[Chunk, int | None]) -> None:
        """The snapshot log's ``copied`` rows, in one commit, of chunks whose rows are committed (or
        that had none): ``copied``, each chunk's documents (None: unknown)."""
        if not copied:
            return
        now = dt.datetime.now(dt.timezone.utc)
        rows = [
            {
                "rs": rs,
                "seq": seq,
                "kind": COPIED,
                "namespace": chunk.namespace,
                "chunk": chunk.index,
                "chunks": chunk.count,
                "documents": documents,
                "recorded_at": now,
            }  # fmt: skip
            for chunk, documents in copied.items()
        ]
        write_deltalake(
            self.source_uri(lake.SNAPSHOT_LOG),
            pa.Table.from_pylist(rows, schema=SNAPSHOT_LOG_SCHEMA),
            mode="append",
            storage_options=self.options,
            commit_properties=CommitProperties(max_commit_retries=COMMIT_RETRIES),
        )

    # -- verifications -----------------------------------------------------------------------------

    def record_verification(self, rows: list[dict]) -> None:
        """Append a verification's rows (``verification_log``) to ``raw/<prefix>/_verifications``."""
        write_deltalake(
            self.source_uri(lake.VERIFICATION_LOG),
            pa.Table.from_pylist(rows, schema=VERIFICATION_LOG_SCHEMA),
            mode="append",
            storage_options=self.options,
            commit_properties=CommitProperties(max_commit_retries=COMMIT_RETRIES),
        )


def _sql_string(value: str) -> str:
    return value.replace("'", "''")
