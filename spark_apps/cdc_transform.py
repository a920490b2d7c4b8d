"""Spark job: every collection's committed raw events -> its Delta ``state`` and ``changes`` tables.

    spark-submit spark_apps/cdc_transform.py --lake-root /lake --topic-prefix shop

Object-store credentials come from the environment (``storage.LakeLocation.from_env``). The lake
says what is committed (the batch log, ``landing.SourceLake``); each derived table records per
replica set the last batch it applied (Delta app transactions, ``raw_events.applied_app_id``) in
the same commit as its data, so a run applies exactly the batches committed since the last one,
whatever crashed before. Spark parallelises the Python work (reading raw files through the lake's
filesystem, folding, typing, building Arrow batches); delta-rs commits, so no Spark jar is needed.

* state: the new events are folded per document (its normalised ``_id``, ``transform.keys``), with
  the stored version where an update without ``after`` needs it, then MERGEd into the table in one
  commit: newer versions update, deletions delete, new documents insert; an event at or before a
  document's stored position changes nothing. A committed snapshot manifest, drop or rename in the
  new batches also deletes the documents of that replica set sitting before it (the MERGE's
  ``when_not_matched_by_source``). Only the data files holding changed documents are rewritten.
* changes: one row per new event, appended, partitioned by ``hour``; old files are never
  rewritten. A new field adds a column; a value whose type conflicts with its column's goes to the
  column's fallback sibling (``transform.columns``). The flattening options (``--flattening``, keyed
  like the source YAML) are recorded in the table's schema: other options rebuild the table, and
  say so. ``--rebuild-hours`` rewrites the rows of those hours from the raw rows and backfilled
  history (a backfill run).

Output: the last stdout line is a JSON summary per ``<db>.<collection>``: ``new_events``,
``state_rows``, ``change_rows``, ``change_rows_written``, ``changes_rebuilt``, and the tables'
versions. Bad arguments print one line to stderr and exit 2 before Spark starts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import re
import sys
from collections.abc import Iterator
from typing import Any, NamedTuple

import bson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from pyspark import RDD, StorageLevel
from pyspark.sql import SparkSession

from mongo_cdc import extjson, lake
from mongo_cdc.extjson import DECODE_OPTIONS
from mongo_cdc.lake import SnapshotManifest
from mongo_cdc.lake_errors import refuse_legacy_layout
from mongo_cdc.landing import COMMIT_RETRIES, Batch, SourceLake
from mongo_cdc.maintenance import maintain_table
from mongo_cdc.storage import LakeLocation, row_count, table_if_exists
from mongo_cdc.transform import columns
from mongo_cdc.transform.document_state import (
    DocumentVersion,
    drop_with_collection,
    fold_events,
    reconcile_with_snapshots,
)
from mongo_cdc.transform.flatten import change_row
from mongo_cdc.transform.flatten_options import FlatteningOptions
from mongo_cdc.transform.keys import document_key
from mongo_cdc.transform.raw_events import (
    RAW_COLUMNS,
    BatchWindow,
    ChangeEvent,
    applied_app_id,
    event_from_row,
)
from mongo_cdc.transform.table_layout import TableLayout

log = logging.getLogger("cdc_transform")

HOUR_NAME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}")
# The state table's leading columns (a DocumentVersion's, with the document rendered two ways).
STATE_METADATA_COLUMNS: tuple[tuple[str, columns.ColumnType], ...] = (
    ("__key", columns.STRING),
    ("__id", columns.STRING),
    ("__doc", columns.STRING),
    ("__doc_bson", columns.BINARY),
    ("__cluster_time", columns.LONG),
    ("__event_order", columns.STRING),
    ("__rs", columns.STRING),
)
# The deletion markers' columns (lake.deletions_uri): a deleted document's last position.
DELETION_COLUMNS = ("__key", "__cluster_time", "__event_order", "__rs")
# A MERGE source row's deletion flag: never a column of the table.
DELETED_FLAG = "__merge_deleted"
# Where the changes table records the flattening options it was written with.
FLATTENING_METADATA = "mongo_cdc.flattening"


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def _flattening(text: str) -> FlatteningOptions:
    try:
        return FlatteningOptions.from_json(json.loads(text))
    except ValueError as error:  # JSONDecodeError included
        raise argparse.ArgumentTypeError(str(error)) from None


def _hours(text: str) -> tuple[str, ...]:
    try:
        hours = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON ({error})") from None
    if not isinstance(hours, list) or not all(isinstance(h, str) and HOUR_NAME.fullmatch(h) for h in hours):
        raise argparse.ArgumentTypeError('expected ["YYYY-MM-DDTHH", ...]')
    return tuple(hours)


def _maintenance(text: str) -> dict[str, int]:
    try:
        settings = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON ({error})") from None
    keys = {"optimize_interval_hours", "retention_hours"}
    if (
        not isinstance(settings, dict)
        or set(settings) != keys
        or not all(
            isinstance(value, int) and not isinstance(value, bool) and value >= 0
            for value in settings.values()
        )
    ):
        raise argparse.ArgumentTypeError(
            'expected {"optimize_interval_hours": <hours>, "retention_hours": <hours>}'
        )
    return settings


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = _ArgumentParser(prog="cdc_transform", description=__doc__.splitlines()[0])
    parser.add_argument("--lake-root", required=True, help="a local path or an s3://, gs://, abfss:// URI")
    parser.add_argument("--topic-prefix", required=True)
    parser.add_argument(
        "--flattening",
        type=_flattening,
        default=FlatteningOptions(),
        help='the changes table\'s event flattening, e.g. {"flatten.struct": true} (defaults otherwise)',
    )
    parser.add_argument(
        "--rebuild-hours",
        type=_hours,
        default=(),
        help='JSON list of hours whose change rows are rewritten, e.g. ["2024-05-01T13"]',
    )
    parser.add_argument(
        "--maintain",
        type=_maintenance,
        default=None,
        help='compact and vacuum every table afterwards, e.g. {"optimize_interval_hours": 24, '
        '"retention_hours": 168}',
    )
    args = parser.parse_args(argv)
    if args.topic_prefix in ("", ".", "..") or "/" in args.topic_prefix:
        parser.error(f"--topic-prefix {args.topic_prefix!r} is not a directory name")
    return args


def build_session() -> SparkSession:
    spark = (
        SparkSession.builder.appName("mongo-cdc-transform")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    return spark


class RawFile(NamedTuple):
    """A data file of a raw table: its path under the lake root, partition and batch range."""

    path: str
    hour: str
    min_seq: int | None
    max_seq: int | None


def raw_files(table: DeltaTable, table_path: str) -> list[RawFile]:
    actions = pa.table(table.get_add_actions(flatten=True))
    names = actions.column_names
    return [
        RawFile(
            f"{table_path}/{row['path']}",
            row["partition.hour"],
            row["min.batch_seq"] if "min.batch_seq" in names else None,
            row["max.batch_seq"] if "max.batch_seq" in names else None,
        )
        for row in actions.to_pylist()
    ]


def read_raw_events(location: LakeLocation, path: str, row_filter: pc.Expression) -> list[ChangeEvent]:
    """The events of one raw data file that pass ``row_filter``."""
    filesystem, base = location.filesystem()
    full_path = f"{base}/{path}" if base else path
    table = pq.read_table(full_path, columns=RAW_COLUMNS, filesystem=filesystem, filters=row_filter)
    return [event_from_row(row) for row in table.to_pylist()]


def arrow_chunks(rdd: RDD, schema: pa.Schema) -> pa.RecordBatchReader:
    """A reader over an RDD of Arrow IPC streams, one partition at a time (memory stays bounded)."""

    def batches() -> Iterator[pa.RecordBatch]:
        for chunk in rdd.toLocalIterator():
            yield from pa.ipc.open_stream(chunk)

    return pa.RecordBatchReader.from_batches(schema, batches())


def ipc_bytes(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def stored_layout(
    table: DeltaTable | None,
    metadata_columns: tuple[tuple[str, columns.ColumnType], ...],
    sanitize_field_names: bool,
    reserved_names: tuple[str, ...] = (),
) -> TableLayout:
    """The layout a table was written with (its schema's type metadata), or a new table's."""
    if table is None:
        return TableLayout(metadata_columns, reserved_names, sanitize_field_names)
    schema = pa.schema(table.schema().to_arrow())
    return TableLayout.from_arrow(schema, metadata_columns, reserved_names, sanitize_field_names)


def evolved_layout(layout: TableLayout, documents: RDD) -> TableLayout:
    """``layout`` with what ``documents`` (an RDD of decoded documents) need: new columns, siblings."""
    surveys = documents.mapPartitions(lambda part: [layout.survey(list(part))])
    return layout.evolved(surveys.fold(columns.NO_CHANGES, lambda a, b: a.merge(b)))


def _position_after(left: str, right: str) -> str:
    """SQL: ``left``'s position is after ``right``'s."""
    return (
        f"({left}.__cluster_time > {right}.__cluster_time OR ({left}.__cluster_time = {right}.__cluster_time "
        f"AND {left}.__event_order > {right}.__event_order))"
    )


def _sql(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class CollectionTransform:
    """Brings one collection's state and changes tables up to the committed raw batches."""

    def __init__(
        self,
        spark: SparkSession,
        source_lake: SourceLake,
        namespace: str,
        batches: list[Batch],
        flattening: FlatteningOptions,
        rebuild_hours: tuple[str, ...],
    ) -> None:
        self.spark = spark
        self.source_lake = source_lake
        self.location = source_lake.location
        self.options = source_lake.options
        self.namespace = namespace
        db, _, collection = namespace.partition(".")
        self.batches = batches
        self.committed: dict[str, int] = {}
        for batch in batches:
            self.committed[batch.rs] = max(batch.seq, self.committed.get(batch.rs, 0))
        manifests = [batch.manifest for batch in batches if batch.manifest is not None]
        self.manifests = [m for m in manifests if namespace in m.collections]
        self.flattening = flattening
        self.rebuild_hours = rebuild_hours
        self.raw_path = "/".join(("raw", source_lake.prefix, db, collection))
        self.state_uri = lake.table_uri(self.location, "state", source_lake.prefix, db, collection)
        self.deletions_uri = lake.deletions_uri(self.location, source_lake.prefix, db, collection)
        self.changes_uri = lake.table_uri(self.location, "changes", source_lake.prefix, db, collection)
        raw = table_if_exists(
            self.location.table_uri("raw", source_lake.prefix, db, collection), self.options
        )
        self.files = raw_files(raw, self.raw_path) if raw is not None else []

    def run(self, maintenance: dict[str, int] | None) -> dict[str, Any]:
        summary = self.update_state()
        summary.update(self.update_changes())
        if maintenance is not None:
            summary["maintenance"] = self.maintain(maintenance)
        return summary

    def maintain(self, settings: dict[str, int]) -> dict[str, Any]:
        """Compact small files and vacuum versions past the retention, table by table."""
        now = dt.datetime.now(dt.timezone.utc)
        done = {}
        for name, uri in (
            ("raw", self.location.table_uri(*self.raw_path.split("/"))),
            ("changes", self.changes_uri),
            ("state", self.state_uri),
            ("deletions", self.deletions_uri),
        ):
            if table_if_exists(uri, self.options) is not None:
                done[name] = maintain_table(
                    uri, self.options, settings["optimize_interval_hours"], settings["retention_hours"], now
                )
        return done

    def events(self, files: list[RawFile], row_filter: pc.Expression) -> RDD:
        location = self.location
        slices = max(1, min(len(files), self.spark.sparkContext.defaultParallelism * 4))
        return self.spark.sparkContext.parallelize([f.path for f in files], slices).flatMap(
            lambda path: read_raw_events(location, path, row_filter)
        )

    def applied(self, table: DeltaTable | None, name: str) -> dict[str, int]:
        if table is None:
            return {}
        return {rs: table.transaction_version(applied_app_id(name, rs)) or 0 for rs in self.committed}

    def commit_properties(self, name: str) -> CommitProperties:
        """The commit's app transactions: this table has applied every committed batch."""
        return CommitProperties(
            app_transactions=[
                Transaction(applied_app_id(name, rs), seq) for rs, seq in self.committed.items()
            ],
            max_commit_retries=COMMIT_RETRIES,
        )

    # -- state ---------------------------------------------------------------------------

    def update_state(self) -> dict[str, Any]:
        table = table_if_exists(self.state_uri, self.options)
        applied = self.applied(table, "state")
        window = BatchWindow.of(self.batches, self.namespace, applied)
        manifests = [m for m in self.manifests if applied.get(m.rs, 0) < m.seq <= self.committed.get(m.rs, 0)]
        if window.is_empty:
            return {"new_events": 0, "state_rows": row_count(table)}
        files = [f for f in self.files if window.may_hold(f.min_seq, f.max_seq)]
        events = self.events(files, window.filter()).persist(StorageLevel.MEMORY_AND_DISK)
        drops = (
            events.filter(lambda event: event.op in lake.COLLECTION_OPERATIONS)
            .map(lambda event: (event.position, event.rs))
            .collect()
        )
        keyed = events.filter(lambda event: event.op not in lake.COLLECTION_OPERATIONS).map(
            lambda event: (document_key(event.document_id), event)
        )
        # an update without the full document applies to the stored version: load just those
        needs_stored = (
            keyed.filter(lambda item: item[1].op == "u" and item[1].after_bson is None)
            .keys()
            .distinct()
            .collect()
        )
        # a deleted document's position stops an older event, landed later (by another shard, say),
        # from bringing it back: its deletion marker is its previous version
        deletions = table_if_exists(self.deletions_uri, self.options)
        in_run = keyed.keys().distinct().collect() if deletions is not None else []
        deleted = _deletion_markers(deletions, in_run)
        stored = self.spark.sparkContext.broadcast({**deleted, **_stored_versions(table, needs_stored)})

        def fold(item: tuple[str, Any]) -> DocumentVersion | None:
            key, document_events = item
            version = fold_events(key, stored.value.get(key), document_events)
            if version is None:
                return None
            return drop_with_collection(reconcile_with_snapshots(version, manifests), drops)

        versions = keyed.groupByKey().map(fold).filter(lambda v: v is not None)
        versions = versions.persist(StorageLevel.MEMORY_AND_DISK)
        layout = evolved_layout(
            stored_layout(table, STATE_METADATA_COLUMNS, self.flattening.sanitize_field_names),
            versions.filter(lambda version: version.document is not None).map(
                lambda version: bson.decode(version.document, DECODE_OPTIONS)
            ),
        )
        new_events = events.count()
        # markers first: applying the same versions again after a crash gives the same markers
        self.update_deletion_markers(deletions, versions, set(deleted))
        if table is None:
            live = versions.filter(lambda version: version.document is not None)
            reader = arrow_chunks(
                live.mapPartitions(lambda part: _state_chunks(part, layout, False)), layout.schema
            )
            write_deltalake(
                self.state_uri,
                reader,
                mode="append",
                storage_options=self.options,
                commit_properties=self.commit_properties("state"),
            )
        else:
            self.merge_state(table, versions, layout, manifests, drops)
        versions.unpersist()
        events.unpersist()
        return {
            "new_events": new_events,
            "state_rows": row_count(table_if_exists(self.state_uri, self.options)),
        }

    def update_deletion_markers(self, markers: DeltaTable | None, versions: RDD, marked: set[str]) -> None:
        """Record the run's deletions; drop the markers of documents that live again."""
        changed = versions.filter(lambda v: v.document is None or v.key in marked).map(
            lambda v: (v.key, v.cluster_time, v.event_order, v.rs, v.document is None)
        )
        rows = changed.collect()
        if not rows:
            return
        columns = list(zip(*rows, strict=True))
        source = pa.table(
            {
                name: pa.array(values)
                for name, values in zip([*DELETION_COLUMNS, DELETED_FLAG], columns, strict=True)
            }
        )
        if markers is None:
            deletions = source.filter(pc.field(DELETED_FLAG)).drop_columns([DELETED_FLAG])
            write_deltalake(self.deletions_uri, deletions, mode="append", storage_options=self.options)
            return
        newer = _position_after("s", "t")
        (
            markers.merge(source, predicate="t.__key = s.__key", source_alias="s", target_alias="t")
            .when_matched_delete(predicate=f"NOT s.{DELETED_FLAG} AND {newer}")
            .when_matched_update_all(predicate=f"s.{DELETED_FLAG} AND {newer}", except_cols=[DELETED_FLAG])
            .when_not_matched_insert_all(predicate=f"s.{DELETED_FLAG}", except_cols=[DELETED_FLAG])
            .execute()
        )

    def merge_state(
        self,
        table: DeltaTable,
        versions: RDD,
        layout: TableLayout,
        manifests: list[SnapshotManifest],
        drops: list[tuple[tuple[int, str], str]],
    ) -> None:
        schema = layout.schema.append(pa.field(DELETED_FLAG, pa.bool_()))
        reader = arrow_chunks(versions.mapPartitions(lambda part: _state_chunks(part, layout, True)), schema)
        merger = table.merge(
            reader,
            predicate="t.__key = s.__key",
            source_alias="s",
            target_alias="t",
            merge_schema=True,
            commit_properties=self.commit_properties("state"),
        )
        newer = _position_after("s", "t")
        merger = merger.when_matched_delete(predicate=f"s.{DELETED_FLAG} AND {newer}")
        merger = merger.when_matched_update_all(
            predicate=f"NOT s.{DELETED_FLAG} AND {newer}", except_cols=[DELETED_FLAG]
        )
        merger = merger.when_not_matched_insert_all(
            predicate=f"NOT s.{DELETED_FLAG}", except_cols=[DELETED_FLAG]
        )
        # documents the new batches did not touch: gone if a snapshot missed them or a drop came after
        gone = [f"(t.__rs = {_sql(m.rs)} AND t.__cluster_time < {m.cluster_time})" for m in manifests]
        gone += [
            f"(t.__rs = {_sql(rs)} AND (t.__cluster_time < {ct} OR (t.__cluster_time = {ct} "
            f"AND t.__event_order < {_sql(order)})))"
            for (ct, order), rs in drops
        ]
        if gone:
            merger = merger.when_not_matched_by_source_delete(predicate=" OR ".join(gone))
        metrics = merger.execute()
        log.info("%s state merge: %s", self.namespace, metrics)

    # -- changes -------------------------------------------------------------------------

    def update_changes(self) -> dict[str, Any]:
        table = table_if_exists(self.changes_uri, self.options)
        rebuilt = table is not None and _recorded_flattening(table) != self.flattening.to_json()
        if rebuilt:
            log.warning(
                "%s: other flattening options than the changes table's: rebuilding it", self.namespace
            )
            table = None
        applied = self.applied(table, "changes")
        window = BatchWindow.of(self.batches, self.namespace, applied)
        written = 0
        if not window.is_empty:
            files = [f for f in self.files if window.may_hold(f.min_seq, f.max_seq)]
            written += self.write_changes(table, files, window.filter(), overwrite=rebuilt)
            table = table_if_exists(self.changes_uri, self.options)
        if self.rebuild_hours and table is not None:
            hours = set(self.rebuild_hours)
            files = [f for f in self.files if f.hour in hours]
            every = BatchWindow.of(self.batches, self.namespace, include_history=True)
            written += self.write_changes(table, files, every.filter(), hours=hours)
            table = table_if_exists(self.changes_uri, self.options)
        return {
            "change_rows": row_count(table),
            "change_rows_written": written,
            "changes_rebuilt": rebuilt,
        }

    def write_changes(
        self,
        table: DeltaTable | None,
        files: list[RawFile],
        row_filter: pc.Expression,
        overwrite: bool = False,
        hours: set[str] | None = None,
    ) -> int:
        """Append the change rows of ``files`` (or replace the table, or the given hours, with them)."""
        options = self.flattening
        rows = self.events(files, row_filter).flatMap(lambda event: _change_rows(event, options))
        rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
        layout = evolved_layout(
            stored_layout(
                None if overwrite else table,
                options.metadata_columns,
                options.sanitize_field_names,
                (lake.HOUR_COLUMN,),
            ),
            rows.map(lambda row: row[1]),
        )
        schema = _with_flattening(layout.schema.append(pa.field(lake.HOUR_COLUMN, pa.string())), options)
        reader = arrow_chunks(rows.mapPartitions(lambda part: _change_chunks(part, layout, schema)), schema)
        count = rows.count()
        properties = self.commit_properties("changes")
        if table is None or overwrite:
            write_deltalake(
                self.changes_uri,
                reader,
                mode="overwrite" if overwrite else "append",
                schema_mode="overwrite" if overwrite else None,
                partition_by=[lake.HOUR_COLUMN],
                storage_options=self.options,
                commit_properties=properties,
            )
        elif hours is not None:
            listed = ", ".join(_sql(hour) for hour in sorted(hours))
            write_deltalake(
                table,
                reader,
                mode="overwrite",
                predicate=f"{lake.HOUR_COLUMN} IN ({listed})",
                schema_mode="merge",
                commit_properties=properties,
            )
        else:
            write_deltalake(table, reader, mode="append", schema_mode="merge", commit_properties=properties)
        rows.unpersist()
        return count


def _stored_versions(table: DeltaTable | None, keys: list[str]) -> dict[str, DocumentVersion]:
    """The stored versions of ``keys`` (documents an update without ``after`` applies to)."""
    if table is None or not keys:
        return {}
    wanted = ["__key", "__id", "__doc_bson", "__cluster_time", "__event_order", "__rs"]
    rows = table.to_pyarrow_dataset().to_table(
        columns=wanted, filter=pc.field("__key").isin(pa.array(keys, pa.string()))
    )
    return {row["__key"]: DocumentVersion(*(row[name] for name in wanted)) for row in rows.to_pylist()}


def _deletion_markers(table: DeltaTable | None, keys: list[str]) -> dict[str, DocumentVersion]:
    """The deletion markers of ``keys``, as versions without a document."""
    if table is None or not keys:
        return {}
    rows = table.to_pyarrow_dataset().to_table(filter=pc.field("__key").isin(pa.array(keys, pa.string())))
    return {
        row["__key"]: DocumentVersion(
            row["__key"], "", None, row["__cluster_time"], row["__event_order"], row["__rs"]
        )
        for row in rows.to_pylist()
    }


def _state_chunks(
    versions: Iterator[DocumentVersion], layout: TableLayout, with_flag: bool
) -> Iterator[bytes]:
    """Arrow IPC chunks of state rows (with the MERGE's deletion flag when ``with_flag``)."""
    chunk: list[DocumentVersion] = []
    for version in versions:
        chunk.append(version)
        if len(chunk) == 50_000:
            yield ipc_bytes(_state_batch(chunk, layout, with_flag))
            chunk = []
    if chunk:
        yield ipc_bytes(_state_batch(chunk, layout, with_flag))


def _state_batch(versions: list[DocumentVersion], layout: TableLayout, with_flag: bool) -> pa.RecordBatch:
    documents = [
        bson.decode(v.document, DECODE_OPTIONS) if v.document is not None else None for v in versions
    ]
    metadata = {
        "__key": pa.array([v.key for v in versions], pa.string()),
        "__id": pa.array([v.document_id_json for v in versions], pa.string()),
        "__doc": pa.array(
            [extjson.encode_str(document) if document is not None else None for document in documents],
            pa.string(),
        ),
        "__doc_bson": pa.array([v.document for v in versions], pa.binary()),
        "__cluster_time": pa.array([v.cluster_time for v in versions], pa.int64()),
        "__event_order": pa.array([v.event_order for v in versions], pa.string()),
        "__rs": pa.array([v.rs for v in versions], pa.string()),
    }
    batch = layout.record_batch(metadata, [document or {} for document in documents])
    if not with_flag:
        return batch
    flags = pa.array([document is None for document in documents], pa.bool_())
    return pa.RecordBatch.from_arrays(
        [*batch.columns, flags], schema=batch.schema.append(pa.field(DELETED_FLAG, pa.bool_()))
    )


def _change_rows(event: ChangeEvent, options: FlatteningOptions) -> list[tuple[tuple, dict]]:
    row = change_row(event, options)
    return [] if row is None else [row]


def _change_chunks(
    rows: Iterator[tuple[tuple, dict]], layout: TableLayout, schema: pa.Schema
) -> Iterator[bytes]:
    chunk: list[tuple[tuple, dict]] = []

    names = [name for name, _ in layout.metadata_columns]

    def batch_of(part: list[tuple[tuple, dict]]) -> bytes:
        part.sort(key=lambda row: row[0][-2:])  # (cluster_time, event_order): files in oplog order
        values = list(zip(*(row[0] for row in part), strict=True))
        metadata = {name: pa.array(column) for name, column in zip(names, values, strict=True)}
        batch = layout.record_batch(metadata, [row[1] for row in part])
        cluster_times = values[names.index("__cluster_time")]
        hours = pa.array([lake.hour_partition(ct) for ct in cluster_times], pa.string())
        return ipc_bytes(pa.RecordBatch.from_arrays([*batch.columns, hours], schema=schema))

    for row in rows:
        chunk.append(row)
        if len(chunk) == 50_000:
            yield batch_of(chunk)
            chunk = []
    if chunk:
        yield batch_of(chunk)


def _with_flattening(schema: pa.Schema, options: FlatteningOptions) -> pa.Schema:
    index = schema.get_field_index(lake.HOUR_COLUMN)
    field = schema.field(index).with_metadata(
        {FLATTENING_METADATA: json.dumps(options.to_json(), sort_keys=True)}
    )
    return schema.set(index, field)


def _recorded_flattening(table: DeltaTable) -> dict[str, Any]:
    """The flattening options the changes table was written with (defaults where none are recorded)."""
    field = pa.schema(table.schema().to_arrow()).field(lake.HOUR_COLUMN)
    recorded = (field.metadata or {}).get(FLATTENING_METADATA.encode())
    return json.loads(recorded) if recorded else FlatteningOptions().to_json()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # force: pyspark installs a root handler on stdout, where only the summary may go.
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s", force=True
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
    source_lake = SourceLake(LakeLocation.from_env(args.lake_root), args.topic_prefix)
    refuse_legacy_layout(source_lake.location, args.topic_prefix)
    batches = source_lake.batches()
    namespaces = sorted({ns for batch in batches for ns in (*batch.namespaces, *(batch.collections or ()))})
    spark = build_session()
    try:
        summary = {}
        for namespace in namespaces:
            log.info("transforming %s", namespace)
            transform = CollectionTransform(
                spark, source_lake, namespace, batches, args.flattening, args.rebuild_hours
            )
            summary[namespace] = transform.run(args.maintain)
    finally:
        spark.stop()
    print(json.dumps({"collections": summary}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
