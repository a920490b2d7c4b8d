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
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from bson import json_util
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from mongo_cdc import extjson, lake
from mongo_cdc.lake import SnapshotManifest
from mongo_cdc.storage import LakeLocation, table_if_exists
from mongo_cdc.transform.raw_events import BatchWindow

log = logging.getLogger(__name__)

BATCH_LOG_SCHEMA = pa.schema(
    [
        pa.field("rs", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        # snapshot (a copy of collections), stream (change events), start (a position, no data)
        pa.field("kind", pa.string(), nullable=False),
        # where streaming resumes after this batch (Extended JSON) and its packed cluster time
        pa.field("resume_token", pa.string()),
        pa.field("cluster_time", pa.int64()),
        # the snapshot manifest: these collections were copied completely as of this position
        pa.field("snapshot_cluster_time", pa.int64()),
        pa.field("collections", pa.list_(pa.string())),
        # the raw tables (<db>.<collection>) this batch wrote rows to
        pa.field("namespaces", pa.list_(pa.string())),
        # counters of a transaction the batch ended inside of (transactions.OpenTransaction)
        pa.field("open_transaction", pa.string()),
        pa.field("landed_at", pa.timestamp("us", tz="UTC")),
    ]
)
# delta-rs retries a commit that lost a race with another writer (shards land concurrently)
COMMIT_RETRIES = 20


@dataclass(frozen=True)
class Batch:
    """One row of the batch log."""

    rs: str
    seq: int
    kind: str
    resume_token: dict | None
    cluster_time: int | None
    snapshot_cluster_time: int | None = None
    collections: tuple[str, ...] | None = None
    namespaces: tuple[str, ...] = ()
    open_transaction: dict | None = None

    @property
    def manifest(self) -> SnapshotManifest | None:
        if self.collections is None or self.snapshot_cluster_time is None:
            return None
        return SnapshotManifest(self.rs, self.seq, self.snapshot_cluster_time, self.collections)

    def to_row(self) -> dict:
        return {
            "rs": self.rs,
            "seq": self.seq,
            "kind": self.kind,
            "resume_token": extjson.encode_str(self.resume_token) if self.resume_token is not None else None,
            "cluster_time": self.cluster_time,
            "snapshot_cluster_time": self.snapshot_cluster_time,
            "collections": list(self.collections) if self.collections is not None else None,
            "namespaces": list(self.namespaces),
            "open_transaction": json.dumps(self.open_transaction) if self.open_transaction else None,
            "landed_at": dt.datetime.now(dt.timezone.utc),
        }

    @classmethod
    def from_row(cls, row: dict) -> Batch:
        token = row["resume_token"]
        return cls(
            rs=row["rs"],
            seq=row["seq"],
            kind=row["kind"],
            resume_token=json_util.loads(token) if token is not None else None,
            cluster_time=row["cluster_time"],
            snapshot_cluster_time=row["snapshot_cluster_time"],
            collections=tuple(row["collections"]) if row["collections"] is not None else None,
            namespaces=tuple(row["namespaces"] or ()),
            open_transaction=json.loads(row["open_transaction"]) if row["open_transaction"] else None,
        )


class SourceLake:
    """One source's raw tables (one ``topic.prefix`` in one lake) and its batch log."""

    def __init__(self, location: LakeLocation, prefix: str) -> None:
        self.location = location
        self.prefix = prefix
        self.options = dict(location.storage_options)
        self._tables: dict[str, DeltaTable] = {}

    def app_id(self, rs: str) -> str:
        return f"mongo-cdc/{self.prefix}/{rs}"

    def raw_uri(self, namespace: str) -> str:
        db, _, collection = namespace.partition(".")
        return lake.table_uri(self.location, "raw", self.prefix, db, collection)

    def source_uri(self, name: str) -> str:
        return lake.source_table_uri(self.location, self.prefix, name)

    def _table(self, uri: str) -> DeltaTable | None:
        table = self._tables.get(uri)
        if table is None:
            table = table_if_exists(uri, self.options)
            if table is not None:
                self._tables[uri] = table
        else:
            table.update_incremental()
        return table

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
        table = self._table(uri)
        transaction = CommitProperties(
            app_transactions=[Transaction(self.app_id(rs), seq)], max_commit_retries=COMMIT_RETRIES
        )
        if table is None:
            write_deltalake(
                uri,
                data,
                partition_by=[lake.HOUR_COLUMN] if lake.HOUR_COLUMN in schema.names else None,
                mode="append",
                storage_options=self.options,
                commit_properties=transaction,
            )
            return
        landed = table.transaction_version(self.app_id(rs))
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
        else:
            write_deltalake(table, data, mode="append", commit_properties=transaction)

    def write_raw(self, rs: str, seq: int, namespace: str, data: pa.Table | pa.RecordBatchReader) -> None:
        self.write(self.raw_uri(namespace), rs, seq, data)

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
        table = self._table(uri)
        if table is not None and (table.transaction_version(self.app_id(batch.rs)) or -1) >= batch.seq:
            return  # a retry of a batch the log has already
        row = pa.Table.from_pylist([batch.to_row()], schema=BATCH_LOG_SCHEMA)
        properties = CommitProperties(
            app_transactions=[Transaction(self.app_id(batch.rs), batch.seq)],
            max_commit_retries=COMMIT_RETRIES,
        )
        write_deltalake(
            table if table is not None else uri,
            row,
            mode="append",
            storage_options=None if table is not None else self.options,
            commit_properties=properties,
        )

    def batches(self) -> list[Batch]:
        """Every committed batch of every replica set, in (rs, seq) order."""
        table = self._table(self.source_uri(lake.BATCH_LOG))
        if table is None:
            return []
        rows = pa.table(table.to_pyarrow_dataset().to_table()).sort_by(
            [("rs", "ascending"), ("seq", "ascending")]
        )
        return [Batch.from_row(row) for row in rows.to_pylist()]

    def last_batch(self, rs: str) -> Batch | None:
        """The replica set's last committed batch (the one its app transaction names)."""
        table = self._table(self.source_uri(lake.BATCH_LOG))
        if table is None:
            return None
        seq = table.transaction_version(self.app_id(rs))
        if seq is None:
            return None
        dataset = table.to_pyarrow_dataset()
        rows = dataset.to_table(filter=(pc.field("rs") == rs) & (pc.field("seq") == seq)).to_pylist()
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
        return table.to_pyarrow_dataset().to_table(columns=columns, filter=window.filter())

    def namespaces(self) -> list[str]:
        """Every ``<db>.<collection>`` some batch wrote raw rows to, sorted."""
        return sorted({namespace for batch in self.batches() for namespace in batch.namespaces})


def _sql_string(value: str) -> str:
    return value.replace("'", "''")


def last_batches(batches: Iterable[Batch]) -> dict[str, Batch]:
    """Each replica set's last committed batch among ``batches``, by replica set name."""
    last: dict[str, Batch] = {}
    for batch in batches:
        if batch.rs not in last or batch.seq > last[batch.rs].seq:
            last[batch.rs] = batch
    return dict(sorted(last.items()))
